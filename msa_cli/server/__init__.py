"""`msa serve`: an OpenAI-compatible HTTP server on the local engine (Starlette on uvicorn)."""
