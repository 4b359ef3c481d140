"""The emulator's Gemini routes at their edges: Google's error envelope, the API key, upload sessions."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from google import genai
from google.genai import errors, types


def _client(emulator) -> genai.Client:
    return genai.Client(api_key="k", http_options=types.HttpOptions(base_url=emulator.url, api_version="v1beta"))


def _post(url: str, headers: dict[str, str], body: bytes = b"{}") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_unknown_batch_is_a_404_in_googles_envelope(batch_emulator):
    client = _client(batch_emulator)  # held: a Client closes its HTTP client when collected
    with pytest.raises(errors.ClientError) as info:
        client.batches.get(name="batches/nope")
    assert (info.value.code, info.value.status) == (404, "NOT_FOUND")


def test_calls_without_an_api_key_are_refused(batch_emulator):
    status, body = _post(f"{batch_emulator.url}/v1beta/models/gemini-2.5-flash:batchGenerateContent", {})
    assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED"


def test_an_upload_chunk_needs_a_live_session_and_the_right_offset(batch_emulator):
    url = f"{batch_emulator.url}/upload/v1beta/files"
    status, body = _post(f"{url}?upload_id=missing", {"X-Goog-Upload-Command": "upload, finalize"}, b"x")
    assert status == 404 and "missing" in body["error"]["message"]
    start = {"x-goog-api-key": "k", "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"}
    request = urllib.request.Request(url, data=b'{"file": {}}', headers=start, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        session_url = response.headers["x-goog-upload-url"]
    chunk = {"X-Goog-Upload-Command": "upload", "X-Goog-Upload-Offset": "5"}
    status, body = _post(session_url, chunk, b"abc")
    assert status == 400 and "offset 5" in body["error"]["message"]


def test_an_uploaded_file_cannot_be_downloaded(batch_emulator, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"key": "a", "request": {"contents": [{"parts": [{"text": "hi"}]}]}}\n')
    client = _client(batch_emulator)
    uploaded = client.files.upload(file=str(path), config={"mime_type": "application/jsonl"})
    assert client.files.get(name=uploaded.name).size_bytes == path.stat().st_size
    with pytest.raises(errors.ClientError) as info:
        client.files.download(file=uploaded.name)
    assert info.value.code == 400
