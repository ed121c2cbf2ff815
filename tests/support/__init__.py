"""What the test suites share, one module per concept. ``tests/`` is on ``sys.path`` (pytest puts
a rootdir conftest's folder there), so tests import ``support.<module>``.

- ``live``: the real ``tensorbits serve`` on a free loopback port (``serve``, ``LiveServer``,
  ``free_port``), and its process's memory.
- ``rawhttp``: HTTP/1.1 by hand over a socket: requests, responses, keep-alive connections, and a
  bystander client checking health while a hostile request runs.
- ``framing``: request bodies framed by ``Inference-Header-Content-Length`` (JSON, then buffers).
- ``inprocess``: the app in process under a ``TestClient``, with the settings a test gives.
- ``v1``, ``v2``: builders and readers for the /v1 batch and v2 inference APIs.
- ``reliability``: small limits, hostile integers and the property every answer must satisfy.
- ``sdk``: what the live tests check through the SDK.
"""
