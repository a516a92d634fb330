"""pulumi_alicloud, imported once with its own import-time deprecation warning silenced."""

import warnings

with warnings.catch_warnings():
    # pulumi-alicloud 4.0.0's package __init__ warns about its own deprecated StarRocksInstance
    # alias on import; the tests turn warnings into errors, so silence exactly that one.
    warnings.filterwarnings(
        "ignore", message=r"alicloud\.index/starrocksinstance", category=DeprecationWarning
    )
    from pulumi_alicloud import Provider, cr, cs, eflo, vpc

__all__ = ["Provider", "cr", "cs", "eflo", "vpc"]
