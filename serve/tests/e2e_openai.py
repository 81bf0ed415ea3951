"""`m3 serve` end to end with the official `openai` client.

Run by `cargo xtask serve-e2e` (which starts the server on the synthetic
tiny default and stops it afterwards); usable by hand against a running
server:

    python serve/tests/e2e_openai.py --base-url http://127.0.0.1:8000 \
        --model NAME --m3 target/debug/m3 --model-dir CHECKPOINT --workdir /tmp/x

Checks: models list, completion, chat, streaming chat with reasoning (no
reasoning text in `content`), chat_template_kwargs, a tool-call round trip,
`stop`, `logprobs`, `usage`, a disconnect mid-stream (its blocks freed, read
from /metrics), malformed requests (400 naming the field, server still
healthy), and 64 concurrent streams that all complete with greedy outputs
equal to `m3 batch` on the same prompts. The comparison is first shown to
catch a planted difference.

The tiny model's weights are random, so its text is noise: every check is
about the server's behaviour, not the text. It never writes a tool call by
itself; the tool-call round trip here checks that a conversation with tools,
an assistant tool call and a tool result renders and answers. Parsing a
generated call into `tool_calls` is covered by serve/tests/server_http.rs
with a scripted model.
"""

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
from openai import AsyncOpenAI, OpenAI

CHECKS = []


def check(name):
    def wrap(f):
        CHECKS.append((name, f))
        return f

    return wrap


class Ctx:
    def __init__(self, args):
        self.args = args
        self.base = args.base_url.rstrip("/")
        self.model = args.model
        self.client = OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=120)
        self.aclient = AsyncOpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=300)

    def raw(self, method, path, body=None):
        """(status, parsed JSON or text) of a raw HTTP request."""
        data = body if isinstance(body, (bytes, type(None))) else body.encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read().decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def metrics(self):
        status, text = self.raw("GET", "/metrics")
        assert status == 200, status
        out = {}
        for line in text.splitlines():
            m = re.match(r"^([a-z_0-9]+) ([0-9.eE+-]+|NaN)$", line)
            if m:
                out[m.group(1)] = float(m.group(2))
        return out


def extra(obj, name):
    """A field the openai types do not declare (kept as pydantic extras)."""
    v = getattr(obj, name, None)
    if v is None and getattr(obj, "model_extra", None):
        v = obj.model_extra.get(name)
    return v


def assert_usage(u, completion=None):
    assert u is not None, "usage missing"
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    assert u.prompt_tokens > 0, u
    if completion is not None:
        assert u.completion_tokens == completion, (u, completion)


@check("models list")
def models(c):
    ms = c.client.models.list()
    ids = [m.id for m in ms.data]
    assert ids == [c.model], ids


@check("completion")
def completion(c):
    r = c.client.completions.create(model=c.model, prompt="hello world", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert isinstance(r.choices[0].text, str) and r.choices[0].text
    assert r.choices[0].finish_reason == "length", r.choices[0].finish_reason
    assert_usage(r.usage, 8)
    # greedy is deterministic
    r2 = c.client.completions.create(model=c.model, prompt="hello world", max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert r2.choices[0].text == r.choices[0].text


@check("chat")
def chat(c):
    r = c.client.chat.completions.create(
        model=c.model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    m = r.choices[0].message
    assert m.role == "assistant"
    assert r.choices[0].finish_reason == "length"
    assert_usage(r.usage, 8)
    # The template opens <think>: everything the model wrote is reasoning.
    rc = extra(m, "reasoning_content")
    assert rc, m
    assert not m.content, f"reasoning leaked into content: {m.content!r}"


@check("streaming chat with reasoning")
def stream_chat(c):
    msgs = [{"role": "user", "content": "think about it"}]
    plain = c.client.chat.completions.create(model=c.model, messages=msgs, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    want = extra(plain.choices[0].message, "reasoning_content")
    stream = c.client.chat.completions.create(
        model=c.model,
        messages=msgs,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    reasoning, content, finish, usage, n = "", "", None, None, 0
    for ch in stream:
        n += 1
        if ch.usage is not None:
            usage = ch.usage
            assert ch.choices == [], "the usage chunk has no choices"
            continue
        d = ch.choices[0].delta
        reasoning += extra(d, "reasoning_content") or ""
        content += d.content or ""
        finish = ch.choices[0].finish_reason or finish
    assert n > 3, n
    assert reasoning == want, (reasoning, want)
    assert content == "", f"reasoning text in content: {content!r}"
    assert "<think>" not in reasoning and "</think>" not in reasoning
    assert finish == "length"
    assert_usage(usage, 24)
    # chat_template_kwargs: thinking off, so the output is content.
    r = c.client.chat.completions.create(
        model=c.model,
        messages=msgs,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": False}},
    )
    m = r.choices[0].message
    assert m.content and not extra(m, "reasoning_content"), m
    assert r.usage.prompt_tokens < plain.usage.prompt_tokens, "the template did not see enable_thinking"


@check("tool-call round trip")
def tools(c):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    base = c.client.chat.completions.create(model=c.model, messages=msgs[:1], max_tokens=4, temperature=0)
    r = c.client.chat.completions.create(model=c.model, messages=msgs, tools=tools, tool_choice="auto", max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    # The tools, the call and its result all went into the prompt.
    assert r.usage.prompt_tokens > base.usage.prompt_tokens + 100, (r.usage, base.usage)
    for call in r.choices[0].message.tool_calls or []:
        json.loads(call.function.arguments)
    # tool_choice the server cannot honour: a 400 naming the field.
    try:
        c.client.chat.completions.create(model=c.model, messages=msgs, tools=tools, tool_choice="required", max_tokens=4)
        raise AssertionError("tool_choice=required accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "tool_choice", e.body


@check("stop")
def stop(c):
    r = c.client.completions.create(model=c.model, prompt="once upon", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = r.choices[0].text
    # a stop string from the middle of the greedy text (printable ASCII)
    cands = [m.start() for m in re.finditer(r"[a-z]{2}", text) if m.start() > 2]
    assert cands, f"no usable stop string in {text!r}"
    i = cands[len(cands) // 2]
    s = text[i : i + 2]
    r2 = c.client.completions.create(model=c.model, prompt="once upon", max_tokens=24, temperature=0, stop=[s], extra_body={"ignore_eos": True})
    assert r2.choices[0].text == text[: text.index(s)], (r2.choices[0].text, text, s)
    assert r2.choices[0].finish_reason == "stop"
    assert r2.usage.completion_tokens < 24
    # streaming: the same cut, the stop string never sent
    st = c.client.completions.create(model=c.model, prompt="once upon", max_tokens=24, temperature=0, stop=[s], stream=True, extra_body={"ignore_eos": True})
    got, fin = "", None
    for ch in st:
        got += ch.choices[0].text
        fin = ch.choices[0].finish_reason or fin
    assert got == r2.choices[0].text and fin == "stop", (got, fin)


@check("logprobs")
def logprobs(c):
    r = c.client.chat.completions.create(
        model=c.model, messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True}
    )
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens == 6, (len(lp), r.usage)
    for t in lp:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 3
        tops = [x.logprob for x in t.top_logprobs]
        assert tops == sorted(tops, reverse=True), tops
        # greedy: the chosen token is the most likely one
        assert abs(t.logprob - tops[0]) < 1e-5, (t.logprob, tops)
    r = c.client.completions.create(model=c.model, prompt="abc", max_tokens=5, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    l = r.choices[0].logprobs
    assert len(l.tokens) == len(l.token_logprobs) == len(l.top_logprobs) == 5
    assert all(len(t) <= 2 for t in l.top_logprobs)


@check("n choices")
def n_choices(c):
    r = c.client.completions.create(model=c.model, prompt="abc", max_tokens=6, temperature=1.0, seed=5, n=3, extra_body={"ignore_eos": True})
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert_usage(r.usage, 18)
    # seeded: the same request gives the same choices
    r2 = c.client.completions.create(model=c.model, prompt="abc", max_tokens=6, temperature=1.0, seed=5, n=3, extra_body={"ignore_eos": True})
    assert [ch.text for ch in r.choices] == [ch.text for ch in r2.choices]
    g = c.client.completions.create(model=c.model, prompt="abc", max_tokens=6, temperature=0, n=2, extra_body={"ignore_eos": True})
    assert g.choices[0].text == g.choices[1].text, "greedy choices differ"


@check("usage")
def usage(c):
    r = c.client.completions.create(model=c.model, prompt=[1, 2, 3, 4], max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert_usage(r.usage, 3)
    assert r.usage.prompt_tokens == 4
    st = c.client.completions.create(model=c.model, prompt=[1, 2, 3, 4], max_tokens=3, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    last = list(st)[-1]
    assert_usage(last.usage, 3)


@check("disconnect mid-stream frees blocks")
def disconnect(c):
    before = c.metrics()
    st = c.client.completions.create(model=c.model, prompt="a long one", max_tokens=400, temperature=0, stream=True, extra_body={"ignore_eos": True})
    it = iter(st)
    next(it)
    next(it)
    used = c.metrics()["m3_kv_blocks_used"]
    assert used > 0, "no blocks held while streaming"
    st.close()  # the client goes away
    t0 = time.time()
    while True:
        m = c.metrics()
        if m["m3_requests_aborted_total"] >= before.get("m3_requests_aborted_total", 0) + 1 and m["m3_kv_blocks_used"] == 0:
            break
        assert time.time() - t0 < 30, f"blocks not freed after disconnect: {m}"
        time.sleep(0.05)
    assert m["m3_num_requests_running"] == 0


@check("malformed requests")
def malformed(c):
    too_long = json.dumps({"model": c.model, "prompt": [65] * 1100})
    cases = [
        ("/v1/completions", "{not json", "body"),
        ("/v1/completions", json.dumps({"model": c.model, "prompt": "a", "max_tokens": 0}), "max_tokens"),
        ("/v1/completions", json.dumps({"model": c.model, "prompt": "a", "max_tokens": 10**9}), "max_tokens"),
        ("/v1/completions", json.dumps({"model": c.model, "prompt": "a", "max_tokens": "many"}), "max_tokens"),
        ("/v1/completions", json.dumps({"model": c.model, "prompt": "a", "temperature": "hot"}), "temperature"),
        ("/v1/completions", json.dumps({"model": c.model, "prompt": {"x": 1}}), "prompt"),
        ("/v1/completions", too_long, "prompt"),
        ("/v1/chat/completions", json.dumps({"model": c.model, "messages": "hi"}), "messages"),
        ("/v1/chat/completions", json.dumps({"model": c.model, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}), "stream"),
        ("/v1/chat/completions", json.dumps({"model": c.model, "messages": [{"role": "user", "content": "x"}], "n": 9}), "n"),
    ]
    for path, body, field in cases:
        status, v = c.raw("POST", path, body)
        assert status == 400, (body, status, v)
        assert v["error"]["param"] == field, (body, v)
    status, v = c.raw("GET", "/health")
    assert status == 200, (status, v)
    r = c.client.completions.create(model=c.model, prompt="still alive", max_tokens=2)
    assert r.usage.completion_tokens >= 1


SPECIAL = ("<|endoftext|>", "<|mask|>")


def strip_special(text):
    for s in SPECIAL:
        text = text.replace(s, "")
    return text


def compare(server, batch):
    """Mismatches between the server's and m3 batch's greedy outputs (by
    request id): token ids and text must be equal. m3 batch's text keeps
    special tokens, the server's skips them (as OpenAI servers do), so they
    are removed from m3 batch's text first."""
    bad = []
    for rid, (toks, text) in sorted(server.items()):
        b = batch.get(rid)
        if b is None:
            bad.append(f"{rid}: no m3 batch result")
        elif b["tokens"] != toks:
            bad.append(f"{rid}: tokens {toks} vs m3 batch {b['tokens']}")
        elif b.get("text") is not None and strip_special(b["text"]) != text:
            bad.append(f"{rid}: text {text!r} vs m3 batch {b['text']!r}")
    if set(batch) != set(server):
        bad.append(f"ids differ: {sorted(set(batch) ^ set(server))}")
    return bad


@check("the greedy comparison catches a planted error")
def planted(c):
    ok = {"r0": ([5, 6, 7], "xyz")}
    assert compare(ok, {"r0": {"tokens": [5, 6, 7], "text": "xyz"}}) == []
    assert compare(ok, {"r0": {"tokens": [5, 6, 8], "text": "xyz"}}), "a wrong token passed"
    assert compare(ok, {"r0": {"tokens": [5, 6, 7], "text": "xyZ"}}), "a wrong text passed"
    assert compare(ok, {}), "a missing result passed"


N_STREAMS = 64
OUT_TOKENS = 12


@check("64 concurrent streams equal m3 batch")
def concurrent(c):
    # Prompt ids are printable ASCII bytes (32..126 are single-byte tokens of
    # the byte-level tokenizer), so the prompt ends on a character boundary
    # and the server's text (decoded after the prompt) equals m3 batch's
    # (decoded alone).
    prompts = {f"r{i}": [32 + (7 * i + 3 * j + j * j) % 95 for j in range(6 + i % 9)] for i in range(N_STREAMS)}

    async def one(rid, prompt):
        st = await c.aclient.completions.create(
            model=c.model,
            prompt=prompt,
            max_tokens=OUT_TOKENS,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        toks, text, fin = [], "", None
        async for ch in st:
            ch0 = ch.choices[0]
            toks += extra(ch0, "token_ids") or []
            text += ch0.text
            fin = ch0.finish_reason or fin
        assert fin == "length", (rid, fin)
        return rid, toks, text

    async def run_all():
        return await asyncio.gather(*(one(r, p) for r, p in prompts.items()))

    t0 = time.time()
    got = asyncio.run(run_all())
    secs = time.time() - t0
    server = {rid: (toks, text) for rid, toks, text in got}
    assert len(server) == N_STREAMS and all(len(t) == OUT_TOKENS for t, _ in server.values())
    inp = f"{c.args.workdir}/batch-in.jsonl"
    out = f"{c.args.workdir}/batch-out.jsonl"
    with open(inp, "w") as f:
        for rid, p in prompts.items():
            f.write(json.dumps({"id": rid, "tokens": p, "max_tokens": OUT_TOKENS}) + "\n")
    subprocess.run(
        [c.args.m3, "batch", "--input", inp, "--output", out, "--model", c.args.model_dir, "--backend", "cpu", "--ignore-eos"],
        check=True,
        timeout=600,
    )
    batch = {}
    with open(out) as f:
        for line in f:
            rec = json.loads(line)
            batch[rec["id"]] = rec
    bad = compare(server, batch)
    assert not bad, "\n".join(bad[:5])
    print(f"  {N_STREAMS} streams x {OUT_TOKENS} tokens in {secs:.1f} s, identical to m3 batch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--m3", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    c = Ctx(args)
    failed = 0
    t0 = time.time()
    for name, f in CHECKS:
        t = time.time()
        try:
            f(c)
            print(f"ok   {name} ({time.time() - t:.1f} s)")
        except Exception as e:  # report every check, then fail
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    passed = len(CHECKS) - failed
    print(f"e2e_openai (openai {openai.__version__}) in {time.time() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
