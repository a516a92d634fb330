"""pulumi_alicloud, loaded once with its own import-time deprecation warnings silenced."""

import warnings

with warnings.catch_warnings():
    # pulumi-alicloud 4.0.0 warns at import time about its own deprecated resources (StarRocks,
    # vpc.Subnet, the ACR Personal Edition's cr.Namespace/cr.Repo, ...), which we do not use;
    # the tests turn warnings into errors, so silence the package's DeprecationWarnings, and
    # only while it loads.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"pulumi_alicloud\.")
    from pulumi_alicloud import Provider, arms, cs, eflo, vpc

    # The SDK loads a submodule on first attribute access: touch each one here, under the filter.
    _LOADED = (arms.PrometheusAlertRule, cs.NodePool, eflo.Cluster, vpc.Switch)

__all__ = ["Provider", "arms", "cs", "eflo", "vpc"]
