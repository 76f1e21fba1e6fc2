"""The tenant identity extension: an Envoy ext_proc server GKE's load balancer calls (a
GCPRoutingExtension on the Gateway, FailClose) on every request's headers, before it selects a
route. It is why a client cannot pick another tenant's priority or flow at the endpoint picker:

  - it removes every client copy of the picker's control headers, both spellings (objective,
    fairness id, model rewrite, latency targets) and of the verified-tenant header;
  - on a path /<tenant>/<model>/... that reaches an endpoint picker, it verifies the request's one
    Bearer token as that tenant's (its issuer's signature from the JWKS, the issuer, an audience
    listed, the subject where the tenant lists subjects, exp/nbf with Envoy's 60 s skew: the
    checks the replica's Istio RequestAuthentication and AuthorizationPolicy make again), then sets
    the tenant's objective for the model, its fairness id and the verified-tenant header, which
    the picker's routes require; without such a token it answers 401 (403 for a token of the
    issuer that is not the tenant's subject) in OpenAI's error format, so nothing reaches the
    picker or a GPU;
  - on the picker's body routes (a chain of its own, full duplex) it also refuses a body whose
    Content-Length is missing, chunked or over the route's limit (413) before reading it, reads
    it (never past that length), refuses one that is not a JSON object (400), and sends it on
    with the tenant's cache_salt appended last, as the replica's guard sets it, so the picker's
    prefix keys match the tenant's salted blocks (salt.py);
  - any other path passes with the headers removed and nothing set.
A bad token, a malformed request or an unreachable JWKS is a 401 or 503, never a 500 or a crash of
the stream.

Modules:
  config.py     IDENTITY_CONFIG: the tenants' jwt specs, the picker prefixes, the header names
  verify.py     a token checked as one tenant's (PyJWT, each issuer's JWKS cached and refreshed)
  processor.py  the ext_proc service: what one request's headers (and a picker route's body) become
  salt.py       the tenant's cache_salt in a body, byte for byte as the guard sets it
  server.py     the gRPC server (TLS, as the load balancer's HTTP/2 backends need), health, signals
"""
