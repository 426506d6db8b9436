"""Public suffix knowledge from tldextract's *bundled* snapshot — never fetched at run time.

`suffix_list_urls=()` disables every HTTP fetch and `cache_dir=None` every disk cache, so the
list comes from the snapshot shipped inside the tldextract wheel (docs/policy.md#lint).
"""

from __future__ import annotations

from functools import cache

import tldextract


@cache
def _extractor() -> tldextract.TLDExtract:
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)


def is_public_suffix(name: str) -> bool:
    """True if `name` (canonical, no wildcard) is itself a public suffix (`com`, `co.uk`)."""
    result = _extractor()(f"x.{name}")
    return bool(result.suffix) and result.suffix == name and result.domain == "x"
