"""Vendor the web assets the project's pages load: each npm package of `pipeline.runtime.web_assets.PACKAGES`, fetched
with `npm pack` from the registry at its pinned version, only the listed files (and the package's license) kept.

    python assets/web/fetch.py            # (re)write assets/web/<package>@<version>/ and assets/web/manifest.json
    python assets/web/fetch.py --check    # fetch again and compare with the manifest; writes nothing

The manifest records each tarball's registry integrity (sha512, as npm checks it) and each kept file's sha256;
tests/unit/test_web_assets.py checks the committed files against it. Needs npm and the registry, once; nothing
else in the project does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from pipeline.runtime.web_assets import MANIFEST, PACKAGES, WEB_ASSETS_DIR, NpmPackage, package_dir

LICENSE_NAMES = ("LICENSE", "LICENSE.txt", "LICENSE.md")


def npm_pack(package: NpmPackage, into: Path) -> tuple[Path, str]:
    """The package's tarball, downloaded into `into`, and the registry's integrity string for it."""
    out = subprocess.run(
        ["npm", "pack", "--json", "--silent", "--pack-destination", str(into), package.spec],
        check=True, capture_output=True, text=True,
    )
    (packed,) = json.loads(out.stdout)
    if (packed["name"], packed["version"]) != (package.name, package.version):
        raise SystemExit(f"npm pack {package.spec} returned {packed['name']}@{packed['version']}")
    return into / packed["filename"], packed["integrity"]


def package_files(tarball: Path, package: NpmPackage) -> dict[str, bytes]:
    """The listed files of the tarball (which keeps everything under package/), plus its license if it has one."""
    with tarfile.open(tarball) as tar:
        members = {m.name.removeprefix("package/"): m for m in tar.getmembers() if m.isfile()}
        wanted = list(package.files) + [name for name in LICENSE_NAMES if name in members][:1]
        missing = [name for name in wanted if name not in members]
        if missing:
            raise SystemExit(f"{package.spec}: the tarball has no {missing}")
        return {name: tar.extractfile(members[name]).read() for name in wanted}


def fetch(check: bool) -> int:
    manifest: dict = {"packages": {}}
    with tempfile.TemporaryDirectory(prefix="npm-pack-") as tmp:
        for package in PACKAGES:
            tarball, integrity = npm_pack(package, Path(tmp))
            files = package_files(tarball, package)
            manifest["packages"][package.spec] = {
                "tarball_integrity": integrity,
                "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
            }
            if not check:
                target = package_dir(package)
                shutil.rmtree(target, ignore_errors=True)
                for name, data in files.items():
                    (target / name).parent.mkdir(parents=True, exist_ok=True)
                    (target / name).write_bytes(data)
            print(f"{package.spec}: {len(files)} files, {sum(map(len, files.values())) / 1024:.0f} kB")
    if check:
        recorded = json.loads(MANIFEST.read_text(encoding="utf-8"))
        if recorded["packages"] != manifest["packages"]:
            print(f"{MANIFEST} differs from the registry's files", file=sys.stderr)
            return 1
        print(f"{MANIFEST} matches the registry")
        return 0
    # Package directories of versions no longer listed: name@version, or @scope/name@version.
    vendored = [d for d in WEB_ASSETS_DIR.iterdir() if "@" in d.name[1:]] + list(WEB_ASSETS_DIR.glob("@*/*@*"))
    for leftover in set(vendored) - {package_dir(p) for p in PACKAGES}:
        shutil.rmtree(leftover)
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the manifest, write nothing")
    sys.exit(fetch(parser.parse_args().check))
