"""The HTTP door: a FastAPI app with one error handler mapping agentdb's exception tree to the envelope."""

from agentdb.api.app import create_app

__all__ = ["create_app"]
