"""Protocol translation through the official SDKs, unchanged: each SDK calls a model of each
other protocol (a key of a `translate: true` group), whole and streamed, with a tool round trip.
The SDKs' own stream accumulators must rebuild the message the whole call returns."""
import json

import anthropic
import openai
import pytest
from google.genai import types as genai_types

from conftest import BRIDGE_KEY, http_client
from test_sdks import EXPECTED_3, gclient

TOOL = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]}
CALL_ARGS = {"city": "Paris", "unit": "celsius"}
CALL = {"x-mock-tool-calls": "1"}


def answered_from(text):
    """The mock answers a tool result with `The tool answered: <what it received>` (a
    generate-content provider receives the result as a response object)."""
    return text in ("The tool answered: sunny", 'The tool answered: {"output":"sunny"}')


# ---------------------------------------------------------------- openai SDK on other models

@pytest.fixture
def oa(gateway):
    return openai.OpenAI(base_url=gateway + "/v1", api_key=BRIDGE_KEY, max_retries=0, **http_client(gateway, openai))


OA_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL}}]


@pytest.mark.parametrize("model", ["beta-opus-4-7", "gamma-3.5-flash"])
def test_openai_sdk_on_other_protocols(oa, model):
    r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == EXPECTED_3
    assert r.model == model
    assert r.usage.completion_tokens == 3

    text, usage = "", None
    for chunk in oa.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], stream=True,
                                            stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        usage = chunk.usage or usage
    assert text == EXPECTED_3
    assert usage is not None and usage.completion_tokens == 3


@pytest.mark.parametrize("model", ["beta-opus-4-7", "gamma-3.5-flash"])
def test_openai_sdk_tool_round_trip_on_other_protocols(oa, model):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    whole = oa.chat.completions.create(model=model, messages=ask, tools=OA_TOOLS, extra_headers=CALL)
    call = whole.choices[0].message.tool_calls[0]
    assert whole.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == CALL_ARGS
    # The SDK's stream accumulator rebuilds the same call from the pieces.
    with oa.chat.completions.stream(model=model, messages=ask, tools=OA_TOOLS, extra_headers=CALL) as stream:
        streamed = stream.get_final_completion()
    scall = streamed.choices[0].message.tool_calls[0]
    assert (scall.function.name, json.loads(scall.function.arguments)) == ("get_weather", CALL_ARGS)
    # The result goes back under the call's id; the model answers from it.
    turn = ask + [whole.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r = oa.chat.completions.create(model=model, messages=turn, tools=OA_TOOLS)
    assert answered_from(r.choices[0].message.content), r.choices[0].message.content


# ---------------------------------------------------------------- anthropic SDK on other models

@pytest.fixture
def an(gateway):
    return anthropic.Anthropic(base_url=str(gateway), api_key=BRIDGE_KEY, max_retries=0, **http_client(gateway, anthropic))


AN_TOOLS = [{"name": "get_weather", "description": "Weather", "input_schema": TOOL}]


@pytest.mark.parametrize("model", ["alpha-5.5", "gamma-3.5-flash"])
def test_anthropic_sdk_on_other_protocols(an, model):
    counts = {"x-mock-usage": "57,3"}
    r = an.messages.create(model=model, max_tokens=100, messages=[{"role": "user", "content": "hi"}], extra_headers=counts)
    assert r.content[0].text == EXPECTED_3
    assert (r.usage.input_tokens, r.usage.output_tokens) == (57, 3)
    with an.messages.stream(model=model, max_tokens=100, messages=[{"role": "user", "content": "hi"}],
                            extra_headers=counts) as s:
        final = s.get_final_message()
    assert final.content[0].text == EXPECTED_3
    # message_start had an estimate; message_delta carries the provider's real counts.
    assert (final.usage.input_tokens, final.usage.output_tokens) == (57, 3)


@pytest.mark.parametrize("model", ["alpha-5.5", "gamma-3.5-flash"])
def test_anthropic_sdk_tool_round_trip_on_other_protocols(an, model):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    whole = an.messages.create(model=model, max_tokens=100, messages=ask, tools=AN_TOOLS, extra_headers=CALL)
    assert whole.stop_reason == "tool_use"
    use = next(b for b in whole.content if b.type == "tool_use")
    assert (use.name, use.input) == ("get_weather", CALL_ARGS)
    with an.messages.stream(model=model, max_tokens=100, messages=ask, tools=AN_TOOLS, extra_headers=CALL) as s:
        final = s.get_final_message()
    suse = next(b for b in final.content if b.type == "tool_use")
    assert (suse.name, suse.input) == ("get_weather", CALL_ARGS), "input_json_delta pieces rebuilt"
    turn = ask + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in whole.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]}]
    r = an.messages.create(model=model, max_tokens=100, messages=turn, tools=AN_TOOLS)
    assert answered_from(r.content[0].text), r.content[0].text


def test_anthropic_sdk_errors_keep_their_type(an):
    with pytest.raises(anthropic.RateLimitError) as e:
        an.messages.create(model="alpha-5.5", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                           extra_headers={"x-mock-status": "429"})
    assert e.value.status_code == 429
    with pytest.raises(anthropic.BadRequestError):
        an.messages.create(model="gamma-3.5-flash", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                           extra_headers={"x-mock-status": "400"}, stream=True)


# ---------------------------------------------------------------- google-genai SDK on other models

GE_TOOLS = [genai_types.Tool(function_declarations=[genai_types.FunctionDeclaration(
    name="get_weather", parameters_json_schema=TOOL)])]


def gconfig(headers=None, tools=None):
    return genai_types.GenerateContentConfig(
        tools=tools, http_options=genai_types.HttpOptions(headers=headers) if headers else None,
        automatic_function_calling=genai_types.AutomaticFunctionCallingConfig(disable=True))


@pytest.mark.parametrize("model", ["alpha-5.5", "beta-opus-4-7"])
def test_gemini_sdk_on_other_protocols(gateway, model):
    c = gclient(gateway, key=BRIDGE_KEY)
    r = c.models.generate_content(model=model, contents="hi")
    assert r.text == EXPECTED_3
    assert r.usage_metadata.candidates_token_count == 3
    chunks = list(c.models.generate_content_stream(model=model, contents="hi"))
    assert "".join(ch.text or "" for ch in chunks) == EXPECTED_3
    assert chunks[-1].usage_metadata.candidates_token_count == 3


@pytest.mark.parametrize("model", ["alpha-5.5", "beta-opus-4-7"])
def test_gemini_sdk_tool_round_trip_on_other_protocols(gateway, model):
    c = gclient(gateway, key=BRIDGE_KEY)
    cfg = gconfig(CALL, GE_TOOLS)
    whole = c.models.generate_content(model=model, contents="Weather in Paris?", config=cfg)
    call = whole.function_calls[0]
    assert (call.name, call.args) == ("get_weather", CALL_ARGS)
    streamed = [fc for ch in c.models.generate_content_stream(model=model, contents="Weather in Paris?", config=cfg)
                for fc in (ch.function_calls or [])]
    assert [(fc.name, fc.args) for fc in streamed] == [("get_weather", CALL_ARGS)]
    turn = [
        genai_types.Content(role="user", parts=[genai_types.Part(text="Weather in Paris?")]),
        whole.candidates[0].content,
        genai_types.Content(role="user", parts=[genai_types.Part(function_response=genai_types.FunctionResponse(
            name="get_weather", id=call.id, response={"output": "sunny"}))]),
    ]
    r = c.models.generate_content(model=model, contents=turn, config=gconfig(tools=GE_TOOLS))
    assert answered_from(r.text), r.text


RS_TOOLS = [{"type": "function", "name": "get_weather", "parameters": TOOL, "strict": False}]


@pytest.mark.parametrize("model", ["beta-opus-4-7", "gamma-3.5-flash"])
def test_openai_responses_api_on_other_protocols(oa, model):
    r = oa.responses.create(model=model, input="hi", store=False)
    assert r.output_text == EXPECTED_3
    assert r.usage.output_tokens == 3
    with oa.responses.stream(model=model, input="hi", store=False) as stream:
        final = stream.get_final_response()
    assert final.output_text == EXPECTED_3 and final.usage.output_tokens == 3
    # A tool round trip: the call item goes back with its output item.
    whole = oa.responses.create(model=model, input="Weather in Paris?", tools=RS_TOOLS, store=False, extra_headers=CALL)
    call = next(i for i in whole.output if i.type == "function_call")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", CALL_ARGS)
    with oa.responses.stream(model=model, input="Weather in Paris?", tools=RS_TOOLS, store=False,
                             extra_headers=CALL) as stream:
        scall = next(i for i in stream.get_final_response().output if i.type == "function_call")
    assert (scall.name, json.loads(scall.arguments)) == ("get_weather", CALL_ARGS)
    turn = [{"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    r = oa.responses.create(model=model, input=turn, tools=RS_TOOLS, store=False)
    assert answered_from(r.output_text), r.output_text
