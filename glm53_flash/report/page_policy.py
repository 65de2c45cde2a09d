"""The content security policy of the pages this package serves or writes (the deck, the playground):
no inline script or style runs unless its exact text is the package's own (a 'sha256-...' source), no
style attribute applies, and nothing is fetched from anywhere but the page's own server. It is the
second layer under the escaping of every value from a receipt: markup that got past the escaping still
runs nothing."""

from __future__ import annotations

import base64
import hashlib

# What every page may do besides its own scripts and styles: images from data: URLs only, requests to
# its own server only, no <base>, no form submission.
BASE_DIRECTIVES = ("default-src 'none'", "img-src data:", "connect-src 'self'", "base-uri 'none'",
                   "form-action 'none'")


def source_hash(text: str) -> str:
    """The CSP source that allows an inline <script> or <style> whose content is exactly `text`."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(scripts: list[str] = (), styles: list[str] = (), header: bool = True) -> str:
    """The policy allowing exactly these inline scripts and style elements. `header`: the HTTP header's
    form, which adds frame-ancestors (a <meta> policy may not carry it)."""
    directives = list(BASE_DIRECTIVES)
    if scripts:
        directives.append("script-src " + " ".join(source_hash(text) for text in scripts))
    if styles:
        directives.append("style-src " + " ".join(source_hash(text) for text in styles))
    if header:
        directives.append("frame-ancestors 'none'")
    return "; ".join(directives)


__all__ = ["BASE_DIRECTIVES", "content_security_policy", "source_hash"]
