"""The request guard and the JSON rules (issue 20), on a real uvicorn server over each backend:
refusals decided from the head come before a byte of the body is sent; the webhook and the
`/v1` API read JSON by one set of rules; nothing refused is stored."""

from __future__ import annotations

import gzip
import json
import socket
from urllib.parse import urlsplit

import pytest

from tests.api.conftest import KEY, Api, bearer
from tests.conftest import table_rows
from tests.http.raw import closed, connect, head, read_answer

SHOP = [("x-telegram-bot-api-secret-token", "shop-secret"), ("content-type", "application/json")]
FIFTY_MB = 50_000_000


def _port(api: Api) -> int:
    port = urlsplit(api.base).port
    assert port is not None
    return port


def _stored(api: Api) -> list[int]:
    return [update_id for (update_id,) in table_rows(api.url, "update_id")]


async def test_a_v1_body_without_a_valid_key_is_refused_before_a_byte_of_it_is_sent(
    api: Api,
) -> None:
    for authorization in ([], [("authorization", "Bearer wrong-key-0123456789")]):
        with connect(_port(api)) as sock:
            sock.sendall(
                head(
                    "POST",
                    "/v1/claims/owns",
                    [
                        ("content-type", "application/json"),
                        ("content-length", str(FIFTY_MB)),
                        *authorization,
                    ],
                )
            )
            answer = read_answer(sock, timeout=5)  # no body sent: the server did not wait
        assert answer.status == 401, authorization
        assert json.loads(answer.body)["error"].startswith("a valid API key is required")
        assert answer.headers["www-authenticate"] == "Bearer"


async def test_a_v1_body_over_the_limit_is_413_declared_or_streamed(api: Api) -> None:
    key = [("authorization", f"Bearer {KEY}"), ("content-type", "application/json")]
    with connect(_port(api)) as sock:
        sock.sendall(head("POST", "/v1/claims/owns", [*key, ("content-length", str(FIFTY_MB))]))
        answer = read_answer(sock, timeout=5)
    assert answer.status == 413
    assert json.loads(answer.body) == {"error": "body over 65536 bytes"}
    # Chunked, no length declared: refused once the stream passes the limit.
    with connect(_port(api)) as sock:
        sock.sendall(head("POST", "/v1/claims/owns", [*key, ("transfer-encoding", "chunked")]))
        chunk = b'{"bot": "' + b"x" * 16_000
        try:
            for _ in range(8):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_answer(sock, timeout=5)
    assert answer.status == 413
    assert json.loads(answer.body) == {"error": "body over 65536 bytes"}
    # Under the limit, the same route answers.
    identity = {"bot": "shop", "update_id": 1, "attempt": 1, "claim_id": "c"}
    assert (await api.post("/v1/claims/owns", identity)).json()["owned"] is False


async def test_a_doubled_authorization_secret_or_encoding_header_is_400(api: Api) -> None:
    update = b'{"update_id": 5}'
    cases = [
        ("GET", "/v1/stats", [("authorization", f"Bearer {KEY}")] * 2, b""),
        ("POST", "/telegram/shop", [*SHOP, SHOP[0]], update),
        ("POST", "/telegram/shop", [*SHOP, ("content-encoding", "identity")] * 1 + [
            ("content-encoding", "identity")], update),
    ]  # fmt: skip
    for method, path, headers, body in cases:
        with connect(_port(api)) as sock:
            sock.sendall(head(method, path, [*headers, ("content-length", str(len(body)))]) + body)
            answer = read_answer(sock)
        assert answer.status == 400, (path, headers)
        assert json.loads(answer.body)["error"].startswith("more than one "), (path, headers)
    assert _stored(api) == []
    # Each header once, the same requests go through.
    assert (await api.http.get("/v1/stats", headers=bearer(KEY))).status_code == 200
    sent = await api.http.post("/telegram/shop", content=update, headers=dict(SHOP))
    assert sent.status_code == 200
    assert _stored(api) == [5]


async def test_any_content_encoding_is_415_after_the_secret_and_the_key(api: Api) -> None:
    plain = b'{"update_id": 6}'
    for encoding, body in (("gzip", plain), ("gzip", gzip.compress(plain)), ("br", plain)):
        headers = {**dict(SHOP), "content-encoding": encoding}
        answer = await api.http.post("/telegram/shop", content=body, headers=headers)
        assert answer.status_code == 415, encoding
        assert answer.json() == {"error": "no Content-Encoding is accepted: send the JSON as it is"}
        wrong = {**headers, "x-telegram-bot-api-secret-token": "wrong"}
        assert (
            await api.http.post("/telegram/shop", content=body, headers=wrong)
        ).status_code == 403
        to_api = {"content-encoding": encoding, "content-type": "application/json"}
        refused = await api.http.post("/v1/claims/owns", content=body, headers=to_api)
        assert refused.status_code == 401, encoding  # the key first
        keyed = await api.http.post(
            "/v1/claims/owns", content=body, headers={**to_api, **bearer(KEY)}
        )
        assert keyed.status_code == 415, encoding
        assert keyed.json() == {"error": "no Content-Encoding is accepted"}
    assert _stored(api) == []
    identity = {**dict(SHOP), "content-encoding": "identity"}
    assert (
        await api.http.post("/telegram/shop", content=plain, headers=identity)
    ).status_code == 200
    assert _stored(api) == [6]


async def test_no_path_redirects_and_no_answer_echoes_the_host(api: Api) -> None:
    for method, path, headers in (
        ("POST", "/telegram/shop/", SHOP),
        ("GET", "/v1/stats/", [("authorization", f"Bearer {KEY}")]),
        ("GET", "/healthz/", []),
    ):
        with connect(_port(api)) as sock:
            sock.sendall(
                head(method, path, [*headers, ("content-length", "16")], host="evil.example")
                + b'{"update_id": 7}'
            )
            answer = read_answer(sock)
        assert answer.status in (401, 404), (path, answer.status)
        assert "location" not in answer.headers, path
        assert b"evil.example" not in answer.body, path
    assert _stored(api) == []


# One set of rules for both readers: the webhook's 400 and the API's say the same.
NOT_JSON = [
    (b'{"update_id": 1701, "update_id": 1702}', "the name 'update_id' appears twice"),
    (b'{"update_id": 8, "x": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'{"update_id": 8, "x": 1e999999999}', "beyond the range of a double"),
    (b'\xef\xbb\xbf{"update_id": 8}', "Expecting value at character 0"),
    (b'{"update_id": 8, "x": "\xff"}', "body is not UTF-8"),
    (b'{"update_id": ' + b"9" * 5_000 + b"}", "beyond the range of a double"),
    (b'{"update_id": 8, "x": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", "nested too deep"),
]


@pytest.mark.parametrize(("body", "problem"), NOT_JSON)
async def test_the_webhook_and_the_api_refuse_the_same_bodies_with_400(
    api: Api, body: bytes, problem: str
) -> None:
    to_webhook = await api.http.post("/telegram/shop", content=body, headers=dict(SHOP))
    to_api = await api.http.post(
        "/v1/claims/owns",
        content=body,
        headers={"content-type": "application/json", **bearer(KEY)},
    )
    for answer in (to_webhook, to_api):
        assert answer.status_code == 400, answer.text
        assert problem in answer.json()["error"]
    assert to_webhook.json() == to_api.json()
    assert _stored(api) == []


async def test_an_integer_is_written_as_one_for_the_webhook_and_the_api(api: Api) -> None:
    webhook = await api.http.post(
        "/telegram/shop", content=b'{"update_id": 9.0}', headers=dict(SHOP)
    )
    assert webhook.status_code == 400
    assert webhook.json() == {"error": "update_id must be an integer from 0 to 2**63-1"}
    identity = b'{"bot": "shop", "update_id": 9.0, "attempt": 1, "claim_id": "c"}'
    answer = await api.http.post(
        "/v1/claims/owns",
        content=identity,
        headers={"content-type": "application/json", **bearer(KEY)},
    )
    assert answer.status_code == 422
    assert "body.update_id" in answer.json()["error"]
    assert _stored(api) == []


async def test_an_escaped_nul_is_kept_verbatim(api: Api) -> None:
    body = '{"update_id": 10, "message": {"text": "a\\u0000b"}}'
    answer = await api.http.post("/telegram/shop", content=body, headers=dict(SHOP))
    assert answer.status_code == 200
    assert table_rows(api.url, "body") == [(body,)]


def test_raw_helpers_see_a_closed_socket() -> None:
    # The control for `closed`: a listener that closes at once, and one that never does.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with connect(port) as sock:
            accepted, _ = server.accept()
            assert not closed(sock, 0.2)
            accepted.close()
            assert closed(sock, 2)
