"""The rest of the OpenAI SDK's surface through tollgate, with the official `openai` Python SDK
(and its JavaScript SDK for images and speech): images generated, edited with a mask and
streamed with partial images; speech streamed to a file while the upstream is still sending; a
20 MiB transcription upload with the gateway's memory measured; translations; moderations; and
the SDK's own video calls on the seed's video API — created from its multipart form with and
without an input reference, listed with its cursor, polled to completion, downloaded, deleted.
Each case billed exactly what the upstream reported or the price table says."""
import json
import os
import shutil
import subprocess
import tempfile
import threading
import urllib.request

import openai
import pytest

from conftest import BIN_DIR, UPSTREAM_KEY
from pysupport import free_port, wait_listening

KEY = "sk-sdk-media-0001"
OTHER = "sk-sdk-media-0002"
NOMEDIA = "sk-sdk-media-0003"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 2000
SPEECH = "The quick brown fox jumps over the lazy dog, twice."


def s3_server():
    cmd = os.environ.get("TOLLGATE_S3_SERVER")
    if cmd:
        return cmd
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(here, ".venv", "bin", "moto_server")


class Media:
    def __init__(self, mock, gateway, gw_pid):
        self.mock, self.gateway, self.gw_pid = mock, gateway, gw_pid

    def client(self, key=KEY, **kw):
        return openai.OpenAI(base_url=self.gateway + "/v1", api_key=key, max_retries=0, **kw)

    def balance(self, key=KEY):
        req = urllib.request.Request(self.gateway + "/v1/usage", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req) as r:
            return round(json.load(r)["balance"] * 1e9)

    def release(self, token):
        urllib.request.urlopen(urllib.request.Request(f"{self.mock}/__mock/release?token={token}", method="POST")).read()

    def requests(self):
        with urllib.request.urlopen(self.mock + "/__mock/requests") as r:
            return json.load(r)

    def memory_kib(self):
        with open(f"/proc/{self.gw_pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


@pytest.fixture(scope="module")
def media():
    tmp = tempfile.mkdtemp(prefix="tollgate-media-")
    mock_port, gw_port, s3_port = free_port(), free_port(), free_port()
    procs = []
    try:
        mock = subprocess.Popen([os.path.join(BIN_DIR, "tollgate-mock"), "--listen", f"127.0.0.1:{mock_port}", "--key", UPSTREAM_KEY])
        procs.append(mock)
        wait_listening(mock_port, mock, "tollgate-mock")
        s3 = subprocess.Popen([s3_server(), "-H", "127.0.0.1", "-p", str(s3_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(s3)
        wait_listening(s3_port, s3, "S3 server")
        config = f"""
listen: 127.0.0.1:{gw_port}
data_dir: {tmp}/data
pingora: {{ threads: 2, pid_file: {tmp}/pid, upgrade_sock: {tmp}/upgrade.sock }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock_port}", api_key: {UPSTREAM_KEY},
      models: [alpha-image, alpha-tts, alpha-whisper, alpha-transcribe, alpha-moderation] }}
groups:
  default: {{ platforms: [openai, video] }}
  nomedia: {{ platforms: [video] }}
prices:
  alpha-image: {{ input: 5.0, output: 10.0, image_input: 10.0, image_output: 40.0 }}
  alpha-tts: {{ input: 0, output: 0, characters: 15.0 }}
  alpha-whisper: {{ input: 0, output: 0, per_second: 0.0001 }}
  alpha-transcribe: {{ input: 2.5, output: 10.0, audio_input: 6.0 }}
  alpha-moderation: {{ input: 0, output: 0 }}
forward_headers: ["x-mock-*"]
video:
  upstream: {{ base_url: "http://127.0.0.1:{mock_port}", secret_id: mock-tc-secret-id, secret_key: mock-tc-secret-key,
              region: ap-guangzhou, version: "2024-05-23", brand: Gen, rate_per_sec: 100 }}
  poll_interval_secs: 1
  prices: {{ genq3-pro: 0.05, genq2: 0.02, genq3-turbo: 0, genq3-pro-fast: 0, genq2-pro: 0, genq2-turbo: 0, genq2-pro-fast: 0 }}
storage:
  s3: {{ endpoint: "http://127.0.0.1:{s3_port}", region: us-east-1, bucket: tollgate-sdk, access_key: testing, secret_key: testing, url_ttl_secs: 3600 }}
keys:
  - {{ key: {KEY}, name: media, group: default, balance: 50.0 }}
  - {{ key: {OTHER}, name: other, group: default, balance: 5.0 }}
  - {{ key: {NOMEDIA}, name: nomedia, group: nomedia, balance: 5.0 }}
"""
        path = os.path.join(tmp, "tollgate.yaml")
        with open(path, "w") as f:
            f.write(config)
        gw = subprocess.Popen([os.path.join(BIN_DIR, "tollgate"), "-c", path], env={**os.environ, "RUST_LOG": "warn"})
        procs.append(gw)
        wait_listening(gw_port, gw, "tollgate")
        yield Media(f"http://127.0.0.1:{mock_port}", f"http://127.0.0.1:{gw_port}", gw.pid)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def nanos(tokens, usd_per_million):
    """What the ledger charges for `tokens` at `usd_per_million` (rounded half up)."""
    return (tokens * round(usd_per_million * 1e9) + 500_000) // 1_000_000


def test_images_generate_and_edit_with_a_mask_are_billed_from_their_usage(media):
    client = media.client()
    before = media.balance()
    img = client.images.generate(model="alpha-image", prompt="a red fox", n=2)
    assert len(img.data) == 2 and img.data[0].b64_json
    u = img.usage
    assert media.balance() == before - nanos(u.input_tokens_details.text_tokens, 5.0) - nanos(u.output_tokens, 40.0)

    before = media.balance()
    edit = client.images.edit(
        model="alpha-image",
        prompt="add a hat",
        image=[("a.png", PNG, "image/png"), ("b.png", PNG, "image/png")],
        mask=("mask.png", PNG, "image/png"),
    )
    u = edit.usage
    assert u.input_tokens_details.image_tokens == 300, "two images and a mask reached the upstream"
    charged = nanos(u.input_tokens_details.text_tokens, 5.0) + nanos(u.input_tokens_details.image_tokens, 10.0) + nanos(u.output_tokens, 40.0)
    assert media.balance() == before - charged
    sent = [r for r in media.requests() if r["path"] == "/v1/images/edits"][-1]
    form = json.loads(sent["body"])
    assert sorted(f["name"] for f in form["files"]) == ["image[]", "image[]", "mask"]


def test_streamed_images_arrive_as_partial_then_completed_events(media):
    client = media.client()
    before = media.balance()
    stream = client.images.generate(model="alpha-image", prompt="a fox in snow", stream=True, partial_images=2)
    events = list(stream)
    assert [e.type for e in events] == ["image_generation.partial_image", "image_generation.partial_image", "image_generation.completed"]
    done = events[-1]
    assert done.b64_json and done.usage.output_tokens == 1000
    assert media.balance() == before - nanos(done.usage.input_tokens, 5.0) - nanos(done.usage.output_tokens, 40.0)


def test_speech_is_streamed_to_a_file_while_the_upstream_is_still_sending(media, tmp_path):
    client = media.client()
    before = media.balance()
    target = tmp_path / "speech.mp3"
    first_seen = threading.Event()
    with client.audio.speech.with_streaming_response.create(
        model="alpha-tts", voice="alloy", input=SPEECH, extra_headers={"x-mock-hold": "py-speech", "x-mock-speech-bytes": "65536"}
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        chunks = response.iter_bytes()
        # The upstream holds the rest back until released: the first bytes must come before.
        timer = threading.Timer(10, lambda: None if first_seen.is_set() else media.release("py-speech"))
        timer.start()
        with open(target, "wb") as f:
            f.write(next(chunks))
            first_seen.set()
            media.release("py-speech")
            for chunk in chunks:
                f.write(chunk)
        timer.cancel()
    assert target.stat().st_size == 65536
    assert media.balance() == before - nanos(len(SPEECH), 15.0)


def test_a_20_mib_transcription_keeps_the_gateways_memory_bounded(media, tmp_path):
    client = media.client()
    audio = tmp_path / "talk.mp3"
    with open(audio, "wb") as f:
        f.write(bytes(range(256)) * (20 * 4096))
    client.audio.transcriptions.create(model="alpha-whisper", file=("warm.mp3", b"\x01" * 65536))
    rss_before, _ = media.memory_kib()
    before = media.balance()
    with open(audio, "rb") as f:
        t = client.audio.transcriptions.create(model="alpha-whisper", file=f, response_format="verbose_json")
    _, peak_after = media.memory_kib()
    seconds = -(-(20 << 20) // 16_000)
    assert t.text == "The mock heard every word." and t.duration == seconds
    assert media.balance() == before - seconds * 100_000
    grown = peak_after - rss_before
    print(f"gateway peak RSS grew {grown} KiB for a 20 MiB upload")
    assert grown < 4096, f"peak resident memory grew {grown} KiB for a 20 MiB upload"


def test_translations_token_transcriptions_and_moderations(media):
    client = media.client()
    before = media.balance()
    tr = client.audio.translations.create(model="alpha-whisper", file=("a.wav", b"\x02" * 160_000))
    assert tr.text == "The mock heard every word."
    assert media.balance() == before - 10 * 100_000
    before = media.balance()
    t = client.audio.transcriptions.create(model="alpha-transcribe", file=("a.wav", b"\x02" * 160_000))
    u = t.usage
    audio = u.input_token_details.audio_tokens
    assert media.balance() == before - nanos(u.input_tokens - audio, 2.5) - nanos(audio, 6.0) - nanos(u.output_tokens, 10.0)
    deltas = [e for e in client.audio.transcriptions.create(model="alpha-transcribe", file=("a.wav", b"\x02" * 16_000), stream=True)]
    assert deltas[-1].type == "transcript.text.done" and deltas[0].type == "transcript.text.delta"
    before = media.balance()
    m = client.moderations.create(model="alpha-moderation", input=["one", "two"])
    assert len(m.results) == 2 and m.results[0].flagged is False
    assert media.balance() == before
    # A key whose group has no OpenAI endpoints: the SDK's NotFoundError.
    with pytest.raises(openai.NotFoundError):
        media.client(NOMEDIA).images.generate(model="alpha-image", prompt="x")


def test_the_sdks_video_calls_create_list_poll_download_and_delete(media):
    client = media.client()
    before = media.balance()
    made = [client.videos.create(model="genq3-pro", prompt=f"sdk video {i}", seconds="8") for i in range(3)]
    assert all(v.status == "queued" for v in made)
    assert media.balance() == before - 3 * 8 * 50_000_000, "each task charged its price at submission"
    # With an uploaded reference, stored and passed on as a URL.
    ref = client.videos.create(model="genq3-pro", prompt="sdk reference", input_reference=("ref.png", PNG, "image/png"))
    assert ref.id.startswith("task_")
    # The key's own tasks, followed page by page with the SDK's cursor.
    listed = [v.id for v in client.videos.list(limit=2)]
    assert sorted(listed) == sorted([v.id for v in made] + [ref.id])
    first_page = client.videos.list(limit=2)
    assert len(first_page.data) == 2 and first_page.has_more
    assert [v.id for v in media.client(OTHER).videos.list()] == []
    done = client.videos.create_and_poll(model="genq3-pro", prompt="sdk polled", seconds="8", poll_interval_ms=300)
    assert done.status == "completed"
    content = client.videos.download_content(done.id)
    assert len(content.read()) > 0
    deleted = client.videos.delete(done.id)
    assert deleted.deleted and deleted.id == done.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(done.id)


def test_the_javascript_sdk_generates_edits_and_streams_speech(media):
    sdk = os.environ.get("TOLLGATE_JS_SDK")
    if not sdk:
        if os.environ.get("TOLLGATE_JS_SDK_REQUIRED"):
            pytest.fail("the openai npm package is required (tests/run_all.sh installs it)")
        pytest.skip("the openai npm package is not installed (tests/run_all.sh installs it)")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js", "media.mjs")
    before = media.balance()
    env = {**os.environ, "NODE_PATH": sdk, "BASE": media.gateway, "MOCK": media.mock, "KEY": KEY, "TEXT": SPEECH}
    out = subprocess.run(["node", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["generate"]["n"] == 2 and got["edit"]["image_tokens"] == 300
    assert got["first_in_time"], "the speech's first bytes came before the upstream was released"
    assert got["speech_bytes"] == 65536
    g, e = got["generate"]["usage"], got["edit"]["usage"]
    charged = (
        nanos(g["input_tokens_details"]["text_tokens"], 5.0)
        + nanos(g["output_tokens"], 40.0)
        + nanos(e["input_tokens_details"]["text_tokens"], 5.0)
        + nanos(e["input_tokens_details"]["image_tokens"], 10.0)
        + nanos(e["output_tokens"], 40.0)
        + nanos(len(SPEECH), 15.0)
    )
    assert media.balance() == before - charged


def test_files_are_kept_in_object_storage_and_owned_by_their_key(media):
    client = media.client()
    lines = b"".join(b'{"custom_id":"r%d","method":"POST","url":"/v1/chat/completions","body":{}}\n' % i for i in range(500))
    made = client.files.create(file=("input.jsonl", lines), purpose="batch")
    assert made.id.startswith("file-") and made.bytes == len(lines) and made.purpose == "batch"
    assert made.id in [f.id for f in client.files.list()]
    assert client.files.retrieve(made.id).filename == "input.jsonl"
    assert client.files.content(made.id).read() == lines
    with pytest.raises(openai.NotFoundError):
        media.client(OTHER).files.retrieve(made.id)
    assert [f.id for f in media.client(OTHER).files.list()] == []
    assert client.files.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
