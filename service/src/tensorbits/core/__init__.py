"""The core: what a request is and how it runs, whatever protocol carried it.

``limits`` (the server's limits as values), ``models`` (model names, versions, states),
``admission`` (bytes and requests in flight), ``plan`` (a decoded request checked into a plan),
``run`` (the run strategies: host, region, streamed, device) and ``dataplane`` (the lifecycle
every front end's request goes through). It imports neither Starlette nor grpc nor the
server's settings; the front ends (``tensorbits.api``, ``tensorbits.grpc``) import it.
"""
