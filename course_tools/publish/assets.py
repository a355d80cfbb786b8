"""The JavaScript a static lecture needs, fetched once from the npm registry and kept locally.

A page written by nbconvert loads reveal.js (slides), require.js, jQuery, MathJax (the formulas) and the
Jupyter widgets HTML manager (the stored "Explore" widgets) from public CDNs. The course's pages
must open offline (in a lecture hall, on a train), so ``make slides`` and ``make site`` copy pinned
versions of these packages next to the pages and point nbconvert at the copies.

Each package is one npm tarball, pinned by version and by the registry's sha512 ``integrity``
value, so a tampered or truncated download is refused. Only the files a page uses are unpacked
(MathJax's tarball is 21 MB; the subset is 5 MB). Tarballs are cached in
``build/vendor/`` (or ``$COURSE_VENDOR_DIR``); a machine without network access can be given the
five files by hand (``python -m course_tools.publish assets`` says where they go).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class Asset:
    """One pinned npm package and the part of it the pages load."""

    name: str
    version: str
    integrity: str  # the registry's ``dist.integrity`` (sha512, base64)
    keep: tuple[str, ...]  # path prefixes inside ``package/`` that are unpacked
    drop: tuple[str, ...] = ()  # prefixes (or suffixes) under ``keep`` that are not

    @property
    def tarball_url(self) -> str:
        base = self.name.rsplit("/", 1)[-1]
        return f"{REGISTRY}/{self.name}/-/{base}-{self.version}.tgz"

    @property
    def dirname(self) -> str:
        return f"{self.name.replace('@', '').replace('/', '-')}-{self.version}"


ASSETS = {
    "reveal": Asset(
        "reveal.js",
        "4.6.1",
        "sha512-1CW0auaXNPmwmvQ7TwpszwVxMi2Xr5cTS3J3EBC/HHgbPF32Dn7aiu/LKWDOGjMbaDwKQiGmfqcoGQ74HUHCMw==",
        keep=("dist/", "plugin/notes/", "LICENSE"),
        drop=(".map",),
    ),
    "require": Asset(
        "requirejs",
        "2.3.7",
        "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
        keep=("require.js", "LICENSE"),
    ),
    "jquery": Asset(
        "jquery",
        "3.7.1",
        "sha512-m4avr8yL8kmFN8psrbFFFmB/If14iN5o9nw/NgnnM+kybDJpRsAynV2BsfpTYrTRysYUdADVD7CkUUizgkpLfg==",
        keep=("dist/jquery.min.js", "LICENSE.txt"),
    ),
    "mathjax": Asset(
        "mathjax",
        "2.7.9",
        "sha512-NOGEDTIM9+MrsqnjPEjVGNx4q0GQxqm61yQwSK+/5S59i26wId5IC5gNu9/bu8+CCVl5p9G2IHcAl/wJa+5+BQ==",
        # nbconvert's configuration is TeX-AMS_CHTML-full,Safe: TeX in, CommonHTML out.
        keep=(
            "MathJax.js",
            "LICENSE",
            "config/TeX-AMS_CHTML-full.js",
            "config/Safe.js",
            "extensions/",
            "jax/input/TeX/",
            "jax/output/CommonHTML/",
            "jax/element/",
            "fonts/HTML-CSS/TeX/woff/",
            "localization/en/",
        ),
    ),
    "widgets": Asset(
        "@jupyter-widgets/html-manager",
        "1.0.15",
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
        keep=("dist/", "LICENSE"),
        drop=(".map", "dist/embed.js", "dist/libembed-amd.js"),
    ),
}

#: the file of each asset that a page links to, relative to the asset's folder
ENTRY = {
    "reveal": "",
    "require": "require.js",
    "jquery": "dist/jquery.min.js",
    "mathjax": "MathJax.js?config=TeX-AMS_CHTML-full,Safe",
    "widgets": "dist/embed-amd.js",
}


class AssetError(RuntimeError):
    """An asset could not be fetched or failed its integrity check."""


def vendor_dir() -> Path:
    """Where tarballs are cached: ``$COURSE_VENDOR_DIR`` or ``build/vendor`` in the repository."""
    env = os.environ.get("COURSE_VENDOR_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "build" / "vendor"


def _check_integrity(data: bytes, asset: Asset) -> None:
    algo, _, expected = asset.integrity.partition("-")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != expected:
        raise AssetError(
            f"{asset.name} {asset.version}: the tarball's {algo} is {got[:16]}…, "
            f"expected {expected[:16]}… (a corrupted or different download); "
            f"delete it from {vendor_dir()} and try again"
        )


def tarball(asset: Asset, *, timeout: float = 60.0) -> bytes:
    """The asset's tarball, from the cache or the registry (then cached); integrity-checked."""
    cache = vendor_dir() / f"{asset.dirname}.tgz"
    if cache.exists():
        data = cache.read_bytes()
    else:
        try:
            with urllib.request.urlopen(asset.tarball_url, timeout=timeout) as response:
                data = response.read()
        except OSError as exc:
            raise AssetError(
                f"could not download {asset.tarball_url} ({exc}). The pages need it to open "
                f"offline. On a machine without network access, copy that file to {cache}"
            ) from exc
        _check_integrity(data, asset)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(data)
    _check_integrity(data, asset)
    return data


def _wanted(path: str, asset: Asset) -> bool:
    return path.startswith(asset.keep) and not any(
        path.startswith(d) or path.endswith(d) for d in asset.drop
    )


def unpack(key: str, dest: Path) -> Path:
    """Unpack the files of asset ``key`` that pages use into ``dest/<package>-<version>/``."""
    if key not in ASSETS:
        raise ValueError(f"asset = {key!r} is not known; valid: {', '.join(ASSETS)}")
    asset = ASSETS[key]
    target = dest / asset.dirname
    marker = target / ".complete"
    if marker.exists():
        return target
    if target.exists():
        shutil.rmtree(target)
    with tarfile.open(fileobj=io.BytesIO(tarball(asset)), mode="r:gz") as tar:
        for member in tar.getmembers():
            path = member.name.split("/", 1)[-1]  # drop the leading "package/"
            data = tar.extractfile(member) if member.isfile() else None  # None: not a file
            if data is None or not _wanted(path, asset):
                continue
            out = target / path
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data.read())
    marker.touch()
    return target


def install(dest: Path) -> dict[str, str]:
    """Unpack every asset under ``dest``; return each one's entry URL relative to ``dest``."""
    urls = {}
    for key in ASSETS:
        folder = unpack(key, dest).relative_to(dest).as_posix()
        urls[key] = f"{folder}/{ENTRY[key]}".rstrip("/")
    return urls
