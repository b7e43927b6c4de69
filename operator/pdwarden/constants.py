"""The operator's identity, fixed once: API names, label keys, annotations, finalizer, handler ids.

Everything that other code, tests, charts or users match on by name lives here so that it can
never drift between modules.
"""

from typing import Final

from pdworker import contract as pdw

GROUP: Final = "pdwarden.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PDDeployment"
PLURAL: Final = "pddeployments"
SINGULAR: Final = "pddeployment"
SHORT_NAME: Final = "pdd"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

# PDRemediationPolicy: remediation for PD pods that pdwarden did not create (issue 14).
POLICY_KIND: Final = "PDRemediationPolicy"
POLICY_PLURAL: Final = "pdremediationpolicies"
POLICY_SINGULAR: Final = "pdremediationpolicy"
POLICY_SHORT_NAME: Final = "pdrp"
POLICY_CRD_NAME: Final = f"{POLICY_PLURAL}.{GROUP}"
# Label a policy sets on the foreign pods it cordons; the user's Service selects value "true".
LABEL_SERVING: Final = f"{GROUP}/serving"
SERVING_TRUE: Final = "true"
SERVING_FALSE: Final = "false"

FIELD_MANAGER: Final = "pdwarden"
FINALIZER: Final = f"{GROUP}/finalizer"
ANNOTATION_PREFIX: Final = GROUP

LABEL_DEPLOYMENT: Final = f"{GROUP}/deployment"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
ANNOTATION_TEMPLATE_HASH: Final = f"{GROUP}/template-hash"
ANNOTATION_RESET_BREAKER: Final = f"{GROUP}/reset-breaker"

# Where worker pods find the tokens pdwarden gives them (Secrets mounted read-only): the admin
# API's bearer token and the KV-handshake key; the file name in both Secrets.
ADMIN_TOKEN_KEY: Final = "token"
ADMIN_TOKEN_DIR: Final = "/var/run/pdwarden/admin"
BOOTSTRAP_TOKEN_DIR: Final = "/var/run/pdwarden/bootstrap"

# Pod condition listed in decode pods' readinessGates; False = cordoned.
CONDITION_SERVING: Final = f"{GROUP}/serving"

ROLE_PREFILL: Final = "prefill"
ROLE_DECODE: Final = "decode"
ROLE_ROUTER: Final = "router"
ROLES: Final = (ROLE_PREFILL, ROLE_DECODE, ROLE_ROUTER)

# kopf handler ids (kopf keys its progress annotations by them: never rename one lightly).
HANDLER_RECONCILE: Final = "reconcile"  # create/update/resume of a PDDeployment
HANDLER_RESYNC: Final = "resync"  # the level-based reconcile daemon
HANDLER_SCRAPE: Final = "scrape"  # the scrape-detect-remediate daemon
HANDLER_FORGET: Final = "forget"  # deletion: drop per-object memory
HANDLER_POLICY: Final = "policy-remediation"  # a PDRemediationPolicy's remediation daemon
HANDLER_POLICY_FORGET: Final = "policy-forget"  # deletion of a policy: drop its memory

# The HTTP port of every worker container (metrics, admin API, generate); render and scraping
# both use this one, and it is the worker's own default (its contract defines the number).
WORKER_PORT: Final = pdw.DEFAULT_HTTP_PORT
