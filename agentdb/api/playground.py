"""The playground: `GET /` and `/playground` serve a page (static files shipped in the package, no build step,
nothing from a CDN) that talks to the public API only, with the caller's key when one is given."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).with_name("static")

# The page runs only its own script and talks only to this server: an injected tag (were any text ever
# rendered as HTML) could neither run inline code nor load or send anything elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)
assets = StaticFiles(directory=STATIC)


@router.get("/")
@router.get("/playground")
def page() -> FileResponse:
    return FileResponse(
        STATIC / "index.html",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )
