"""Pure rendering: a PDDeployment's spec becomes the Kubernetes objects that run it.

Why a package: rendering is the heart of reconciling and must stay pure (no client, no I/O) so
every object the operator writes can be unit-tested from a spec alone. `render_deployment` is the
one entry point; the modules beside it each build one family of objects.
"""

from pdwarden.render.common import Owner, names
from pdwarden.render.deployment import render_deployment

__all__ = ["Owner", "names", "render_deployment"]
