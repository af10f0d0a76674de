"""schemathesis hooks for zkguard's API (loaded through SCHEMATHESIS_HOOKS).

`POST /v1/bulk` takes NDJSON, which schemathesis has no serializer for: its body is documented
as one string (the lines), sent as is, so that generated bodies reach the parser.
"""

import schemathesis


@schemathesis.serializer("application/x-ndjson")
def ndjson(ctx, value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    import json

    return json.dumps(value).encode()
