"""The Data Docs site made to work offline, once GX has written it.

GX's pages load Bootstrap, jQuery, bootstrap-table, Font Awesome, vega and their logo from CDNs and an S3 bucket.
`pipeline.offline_pages` copies the npm packages beside the site and points the pages at them; what is GX's own
is fixed here:
- the logos: GX copies `static/images/logo-long.png` into every site but its navigation bar loads the same logo
  from S3 (and a dark-mode variant that no GX package ships): both point at the site's copy;
- the favicon: validation-result pages lie four directories deep, but GX's favicon link climbs three, so it
  names no file; it is pointed at the site's `static/images/favicon.ico`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.offline_pages import make_offline

GX_WEB_ASSETS = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/"
SITE_LOGO = "static/images/logo-long.png"
SITE_FAVICON = "static/images/favicon.ico"
LOGOS = {GX_WEB_ASSETS + "logo-long.png": SITE_LOGO, GX_WEB_ASSETS + "full_logo_dark.png": SITE_LOGO}
FAVICON_LINK = re.compile(r"""(<link\b[^>]*\bhref=["'])[^"']*static/images/favicon\.ico(["'])""")


def fix_favicon_links(site_dir: Path) -> None:
    """Point every page's favicon link at the site's own favicon, however deep the page lies."""
    for page in site_dir.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        relative = Path(os.path.relpath(site_dir / SITE_FAVICON, page.parent)).as_posix()
        fixed = FAVICON_LINK.sub(lambda m, link=relative: f"{m.group(1)}{link}{m.group(2)}", text)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")


def make_data_docs_offline(site_dir: Path) -> None:
    """Make the finished site load nothing from another host; raises OfflinePageError naming what still would."""
    fix_favicon_links(site_dir)
    make_offline(site_dir, LOGOS)
