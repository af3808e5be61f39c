"""The playground: `GET /` and `/playground` serve a page (static files shipped in the package, no build step,
nothing from a CDN) that talks to the public API only, with the caller's key when one is given."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles

from agentdb.resources import STATIC, resource

# The page runs only its own script and talks only to this server: an injected tag (were any text ever
# rendered as HTML) could neither run inline code nor load or send anything elsewhere.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)

router = APIRouter(include_in_schema=False)
assets = StaticFiles(packages=[("agentdb.api", "static")])


@router.get("/")
@router.get("/playground")
def page() -> Response:
    return Response(
        resource(STATIC, "index.html").read_bytes(),
        media_type="text/html",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )
