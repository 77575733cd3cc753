"""The Python client: routing and retries (core), asyncio and blocking front ends."""
