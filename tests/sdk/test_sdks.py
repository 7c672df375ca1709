"""The official SDKs, unchanged, pointed at tollgate: every protocol, streaming and not,
model lists and auth errors."""
import ssl

import anthropic
import openai
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as genai_types

from conftest import CHAT_KEY, CLIENT_KEY, http_client

EXPECTED_3 = "Hello from the"


# ---------------------------------------------------------------- chat-completions style

@pytest.fixture
def oa(gateway):
    return openai.OpenAI(base_url=gateway + "/v1", api_key=CLIENT_KEY, max_retries=0, **http_client(gateway, openai))


def test_openai_chat(oa):
    r = oa.chat.completions.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == EXPECTED_3
    assert r.usage.completion_tokens == 3
    assert r.model == "alpha-5.5"


def test_openai_chat_stream(oa):
    stream = oa.chat.completions.create(
        model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage:
            usage = chunk.usage
    assert text == EXPECTED_3
    assert usage is not None and usage.completion_tokens == 3


def test_openai_chat_stream_without_usage_option(oa):
    # tollgate asks the upstream for usage (to bill it) and withholds that extra chunk.
    chunks = list(oa.chat.completions.create(
        model="alpha-5.5", messages=[{"role": "user", "content": "hi"}], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == EXPECTED_3
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_openai_responses(oa):
    r = oa.responses.create(model="alpha-5.5", input="hi")
    assert r.output_text == EXPECTED_3
    assert r.usage.output_tokens == 3


def test_openai_responses_stream(oa):
    deltas, completed = [], None
    for event in oa.responses.create(model="alpha-5.5", input="hi", stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            completed = event.response
    assert "".join(deltas) == EXPECTED_3
    assert completed is not None and completed.usage.output_tokens == 3


def test_openai_embeddings(oa):
    r = oa.embeddings.create(model="alpha-embed-3", input=["a", "b"])
    assert len(r.data) == 2
    assert r.data[0].embedding == [0.25, -0.5, 0.125, 1.0]
    r = oa.embeddings.create(model="alpha-embed-3", input="a", encoding_format="float")
    assert r.data[0].embedding == [0.25, -0.5, 0.125, 1.0]


def test_openai_models(oa):
    # What this client's endpoints serve the key's group (it does not translate): not the
    # messages or generate-content models, whose calls here would be 404.
    ids = [m.id for m in oa.models.list()]
    assert ids == ["alpha-5.5", "alpha-embed-3"]


def test_openai_errors(gateway):
    bad = openai.OpenAI(base_url=gateway + "/v1", api_key="sk-wrong-0000", max_retries=0, **http_client(gateway, openai))
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="alpha-5.5", messages=[])
    good = openai.OpenAI(base_url=gateway + "/v1", api_key=CLIENT_KEY, max_retries=0, **http_client(gateway, openai))
    with pytest.raises(openai.NotFoundError) as e:
        good.chat.completions.create(model="alpha-none", messages=[])
    assert e.value.code == "model_not_found"


# ---------------------------------------------------------------- messages style

@pytest.fixture
def an(gateway):
    return anthropic.Anthropic(base_url=gateway, api_key=CLIENT_KEY, max_retries=0, **http_client(gateway, anthropic))


def test_anthropic_messages(an):
    r = an.messages.create(model="beta-opus-4-7", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
    assert r.content[0].text == EXPECTED_3
    assert r.usage.output_tokens == 3


def test_anthropic_messages_stream(an):
    with an.messages.stream(model="beta-opus-4-7", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == EXPECTED_3
    assert final.usage.output_tokens == 3
    assert final.stop_reason == "end_turn"


def test_anthropic_raw_stream_events(an):
    types = [e.type for e in an.messages.create(
        model="beta-sonnet-4-6", max_tokens=16, messages=[{"role": "user", "content": "hi"}], stream=True)]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert "message_delta" in types


def test_anthropic_models(an):
    ids = [m.id for m in an.models.list()]
    assert ids == ["beta-opus-4-7", "beta-sonnet-4-6"]


def test_anthropic_errors(gateway):
    bad = anthropic.Anthropic(base_url=gateway, api_key="sk-wrong-0000", max_retries=0, **http_client(gateway, anthropic))
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="beta-opus-4-7", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    chat_only = anthropic.Anthropic(base_url=gateway, api_key=CHAT_KEY, max_retries=0, **http_client(gateway, anthropic))
    with pytest.raises(anthropic.NotFoundError):
        chat_only.messages.create(model="beta-opus-4-7", max_tokens=1, messages=[{"role": "user", "content": "x"}])


# ---------------------------------------------------------------- generate-content style

def gclient(gateway, key=CLIENT_KEY, api_version=None):
    opts = {"base_url": str(gateway)}
    if gateway.https:
        opts["client_args"] = {"verify": ssl.create_default_context(cafile=gateway.ca), "http2": True}
    if api_version:
        opts["api_version"] = api_version
    return genai.Client(api_key=key, http_options=genai_types.HttpOptions(**opts))


@pytest.mark.parametrize("api_version", [None, "v1beta"])
def test_gemini_generate(gateway, api_version):
    c = gclient(gateway, api_version=api_version)  # keep a reference: a dropped Client closes its connection
    r = c.models.generate_content(model="gamma-3.5-flash", contents="hi")
    assert r.text == EXPECTED_3
    assert r.usage_metadata.candidates_token_count == 3


@pytest.mark.parametrize("api_version", [None, "v1beta"])
def test_gemini_stream(gateway, api_version):
    c = gclient(gateway, api_version=api_version)
    chunks = list(c.models.generate_content_stream(model="gamma-3.5-flash", contents="hi"))
    assert "".join(c.text or "" for c in chunks) == EXPECTED_3
    assert len(chunks) == 3
    assert chunks[-1].usage_metadata.candidates_token_count == 3


def test_gemini_models(gateway):
    c = gclient(gateway, api_version="v1beta")
    names = [m.name for m in c.models.list()]
    assert names == ["models/gamma-3.5-flash"]
    assert c.models.get(model="gamma-3.5-flash").name == "models/gamma-3.5-flash"
    with pytest.raises(genai_errors.ClientError) as e:
        c.models.get(model="gamma-none")
    assert e.value.code == 404


def test_gemini_errors(gateway):
    bad = gclient(gateway, key="sk-wrong-0000")
    with pytest.raises(genai_errors.ClientError) as e:
        bad.models.generate_content(model="gamma-3.5-flash", contents="hi")
    assert e.value.code == 401
    assert e.value.status == "UNAUTHENTICATED"
    chat_only = gclient(gateway, key=CHAT_KEY)
    with pytest.raises(genai_errors.ClientError) as e:
        chat_only.models.generate_content(model="gamma-3.5-flash", contents="hi")
    assert e.value.code == 404


def test_transport(oa, gateway):
    """Over HTTPS the SDK really speaks HTTP/2 to tollgate."""
    raw = oa.chat.completions.with_raw_response.create(model="alpha-5.5", messages=[{"role": "user", "content": "hi"}])
    assert raw.http_response.http_version == ("HTTP/2" if gateway.https else "HTTP/1.1")
    assert raw.parse().choices[0].message.content == EXPECTED_3
