"""The Screened condition: how Prometheus's screen judged an object's pods (prometheus mode).

Why apart from the ledger: it is the one condition only one observation mode writes, and its
wording (which pods, why) is what a user reads to fix their Prometheus.
"""

from __future__ import annotations

from typing import Final

from pdwarden.remediation.scrape import sanitize
from pdwarden.values import ScreenReport

SCREENED: Final = "Screened"
MAX_SCREEN_MESSAGE: Final = 1024
NAMED: Final = 8  # pods named in the message


def screen_condition(report: ScreenReport) -> tuple[bool, str, str]:
    """The Screened condition: True while Prometheus vouches for every pod the object covers;
    False, naming the pods and why, while some are not judged (no action on them)."""
    if report.error:
        return False, "PrometheusUnavailable", sanitize.text(
            f"Prometheus ({report.source}) gave no usable answer: {report.error}; none of the "
            f"{report.pods} worker pod(s) is judged or acted on until it does", MAX_SCREEN_MESSAGE,
        )  # fmt: skip
    if report.missing:
        lag = all("last scraped" in why for why in report.missing.values())
        shown = "; ".join(f"{pod}: {why}" for pod, why in sorted(report.missing.items())[:NAMED])
        more = len(report.missing) - NAMED
        return False, "PrometheusLagging" if lag else "PrometheusPartial", sanitize.text(
            f"{len(report.missing)} of {report.pods} worker pod(s) not judged or acted on, "
            f"the screen cannot tell about them: {shown}" + (f"; and {more} more" if more > 0
            else ""), MAX_SCREEN_MESSAGE,
        )  # fmt: skip
    return (
        True,
        "Screened",
        (
            f"{report.pods} worker pod(s) screened by Prometheus ({report.source}); "
            f"{report.direct} read directly this cycle (suspects)"
        ),
    )
