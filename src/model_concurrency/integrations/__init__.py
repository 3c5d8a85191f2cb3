"""Wrappers that put a client this package does not own through the gate: each request takes ``slot(model)``.

* :mod:`.httpx`: a transport for any ``httpx.Client`` / ``httpx.AsyncClient`` (the OpenAI SDK, LangChain's
  clients, hand-written calls alike);
* :mod:`.openai`: an ``OpenAI`` / ``AsyncOpenAI`` client whose requests go through that transport;
* :mod:`.client`: ``ShardedAsyncClient`` / ``ShardedClient``, httpx clients whose cost per call stays flat at
  hundreds of calls in flight (re-exported from :mod:`.httpx`; the wrapped OpenAI clients send through them).

Each request is counted in its model's in-flight and waits its turn like a fan-out's call; its latency and
outcome feed the next poll, a 429/503 counts as throttled and its ``Retry-After`` holds the model's admissions.
"""
