"""`msa serve`'s guards, on a tiny random model in-process: web pages kept out (Host, Origin,
Content-Type; CORS only for listed origins), the cap on requests at once, the body's size and
time limits, errors that are the client's (nested JSON, a template that fails) as 400s, the
access log, /v1/models/{id}."""

from __future__ import annotations

import asyncio
import io
import json
import re

from tiny_server import TINY, asgi_client, tiny_app, tiny_loaded

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def run(scenario, **app_options):
    """Run `scenario(client)` against a tiny app made with `app_options`; its result."""

    async def main():
        async with asgi_client(tiny_app(**app_options)) as client:
            return await scenario(client)

    return asyncio.run(main())


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error


def test_a_keyless_server_refuses_other_host_names_web_origins_and_non_json_posts():
    async def scenario(client):
        url = "/v1/chat/completions"
        return [
            await client.get("/health", headers={"Host": "evil.example:8000"}),
            await client.post(url, json=CHAT, headers={"Host": "rebound.example"}),
            await client.post(url, json=CHAT, headers={"Origin": "https://evil.example"}),
            await client.get("/v1/models", headers={"Origin": "null"}),
            await client.post(
                url, content=json.dumps(CHAT), headers={"Content-Type": "text/plain"}
            ),
            await client.post(url, content=json.dumps(CHAT)),  # no Content-Type
            await client.get("/health", headers={"Host": "localhost:8000"}),
            await client.post(url, json=CHAT, headers={"Host": "[::1]:8000"}),
        ]

    responses = run(scenario)
    codes = [error_of(r, s)["code"] for r, s in zip(responses[:6], [403, 403, 403, 403, 415, 415])]
    assert codes[:4] == ["host_not_allowed"] * 2 + ["origin_not_allowed"] * 2
    assert [r.status_code for r in responses[6:]] == [200, 200]


def test_a_server_with_a_key_beyond_loopback_takes_any_host_name():
    async def scenario(client):
        key = {"Authorization": "Bearer k"}
        return await client.get("/health", headers={**key, "Host": "gpu-box.lan:8000"})

    assert run(scenario, api_key="k", bind_host="0.0.0.0").status_code == 200


def test_listed_origins_get_cors_and_others_are_refused():
    app_origin, other = "https://app.example", "https://evil.example"

    def preflight(origin):
        return {
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        }

    async def scenario(client):
        return (
            await client.options("/v1/chat/completions", headers=preflight(app_origin)),
            await client.options("/v1/chat/completions", headers=preflight(other)),
            await client.post("/v1/chat/completions", json=CHAT, headers={"Origin": app_origin}),
        )

    allowed, refused, answered = run(scenario, allow_origins=(app_origin,))
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == app_origin
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "authorization" in allowed.headers["access-control-allow-headers"].lower()
    assert error_of(refused, 403)["code"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in refused.headers
    assert answered.status_code == 200
    assert answered.headers["access-control-allow-origin"] == app_origin


def test_any_origin_with_a_key():
    async def scenario(client):
        headers = {"Origin": "https://any.example", "Authorization": "Bearer k"}
        return await client.post("/v1/chat/completions", json=CHAT, headers=headers)

    answered = run(scenario, api_key="k", allow_origins=("*",))
    assert answered.status_code == 200 and answered.headers["access-control-allow-origin"] == "*"


def test_requests_past_the_cap_get_a_503_with_retry_after_while_a_slow_body_holds_a_place():
    async def scenario(client):
        reading, arrived = asyncio.Event(), asyncio.Event()

        async def slow_body():
            reading.set()  # the server is reading this body: the request holds its place
            yield b'{"messages": [{"role": "user", '
            await arrived.wait()
            yield b'"content": "hello"}], "max_tokens": 2}'

        headers = {"Content-Type": "application/json"}
        slow = asyncio.ensure_future(
            client.post("/v1/chat/completions", content=slow_body(), headers=headers)
        )
        await reading.wait()
        refused = await client.get("/health")
        arrived.set()
        return refused, await slow, await client.get("/health")

    refused, slow, after = run(scenario, max_concurrent_requests=1)
    assert error_of(refused, 503)["code"] == "too_many_requests"
    assert refused.headers["retry-after"] == "2"
    assert slow.status_code == 200 and after.status_code == 200  # the place is given back


def test_a_body_that_does_not_arrive_in_time_is_a_408_and_one_over_the_limit_is_not_read_whole():
    pulled = []

    async def scenario(client):
        async def stalled_body():
            yield b'{"messages": '
            await asyncio.Event().wait()  # never set: the body never ends

        async def endless_body():
            while True:
                pulled.append(10_000)
                yield b" " * 10_000

        headers = {"Content-Type": "application/json"}
        url = "/v1/chat/completions"
        return (
            await client.post(url, content=stalled_body(), headers=headers),
            await client.post(url, content=endless_body(), headers=headers),
        )

    stalled, endless = run(scenario, body_timeout_s=0.5, max_request_bytes=100_000)
    assert error_of(stalled, 408)["code"] == "request_timeout"
    assert error_of(endless, 400)["code"] == "request_too_large"
    assert sum(pulled) <= 100_000 + 2 * 10_000  # read up to the limit, then refused


def test_json_nested_too_deeply_and_a_failing_chat_template_are_400s_naming_the_problem():
    nested = b"[" * 20_000 + b"]" * 20_000
    # a template that reads what the sandbox forbids, and one that uses an undefined value
    unsafe = "{{ messages[0].content.__class__.__mro__[1].__subclasses__() }}"
    undefined = "{{ messages[0].missing.deeper }}"

    async def post(client, content):
        headers = {"Content-Type": "application/json"}
        return await client.post("/v1/chat/completions", content=content, headers=headers)

    async def nested_scenario(client):
        return await post(client, nested), await post(client, b'{"messages": ' + nested + b"}")

    for response in run(nested_scenario):
        assert "nested too deeply" in error_of(response, 400)["message"]
    for template, problem in [(unsafe, "SecurityError"), (undefined, "UndefinedError")]:

        async def template_scenario(client):
            return await post(client, json.dumps(CHAT))

        error = error_of(run(template_scenario, loaded=tiny_loaded(template)), 400)
        assert problem in error["message"] and "chat template" in error["message"], error


def test_one_access_log_line_per_request_without_the_key_or_the_body():
    log = io.StringIO()

    async def scenario(client):
        key = {"Authorization": "Bearer s3cret-key"}
        await client.get(f"/v1/models/{TINY}", headers=key)
        await client.get("/v1/models/gpt-4o", headers=key)
        await client.post("/v1/chat/completions?x=1", json=CHAT, headers=key)
        await client.post("/v1/chat/completions", json=CHAT)
        await client.get("/v1/models/%1b[31m", headers=key)  # an escape, never printed

    run(scenario, api_key="s3cret-key", log=log)
    lines = log.getvalue().splitlines()
    pattern = r"msa serve: 127\.0\.0\.1 (GET|POST) (\S+) (\d{3}) \d+\.\d{3}s"
    parsed = [re.fullmatch(pattern, line).groups() for line in lines]
    assert parsed == [
        ("GET", f"/v1/models/{TINY}", "200"),
        ("GET", "/v1/models/gpt-4o", "404"),
        ("POST", "/v1/chat/completions", "200"),
        ("POST", "/v1/chat/completions", "401"),
        ("GET", "/v1/models/%1b[31m", "404"),
    ]
    assert "s3cret" not in log.getvalue() and "hello" not in log.getvalue()


def test_v1_models_id_is_our_model_or_an_openai_404():
    async def scenario(client):
        return await client.get(f"/v1/models/{TINY}"), await client.get("/v1/models/org/other")

    ours, other = run(scenario)
    assert ours.status_code == 200
    assert {k: v for k, v in ours.json().items() if k != "created"} == {
        "id": TINY,
        "object": "model",
        "owned_by": "msa",
    }
    assert error_of(other, 404)["code"] == "model_not_found"


def test_msa_serve_refuses_to_listen_beyond_loopback_without_a_key_or_open_to_any_page():
    from typer.testing import CliRunner

    from msa.app import app

    for args, option in [
        (["--host", "0.0.0.0"], "--host"),
        (["--api-key", ""], "--api-key"),
        (["--allow-origin", "*"], "--allow-origin"),
        (["--api-key", "k", "--allow-origin", "app.example"], "--allow-origin"),
    ]:
        # a model that is not there: a server that did not refuse would end there (exit 4), not
        # serve for ever
        result = CliRunner().invoke(app, ["serve", "--port", "0", "-m", "/nowhere.gguf", *args])
        lines = result.stderr.splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0].startswith(f"msa: error: {option}: "), lines
