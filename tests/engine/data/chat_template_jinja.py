#!/usr/bin/env python3
"""chat_template_jinja.py: the reference renders for tests/engine/data/test_chat_template.c.

Renders conversations with a model's own Jinja chat template the way Hugging Face's
apply_chat_template does (transformers' _compile_jinja_template: an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, `tojson` as
json.dumps(ensure_ascii=False), `raise_exception`), with python3-jinja2 only.

  chat_template_jinja.py TEMPLATE < requests.jsonl > renders.jsonl

TEMPLATE is a .jinja file or a tokenizer_config.json (its "chat_template"). Each request line is
{"messages": [...], "add_generation_prompt": bool, "enable_thinking": bool,
"drop_reasoning": bool}; drop_reasoning renders every assistant turn as its content after the
last </think> (lstrip '\\n') with reasoning_content "" (what ddt_chat's drop_reasoning means).
Each output line is {"text": "..."} or {"error": "..."} (the template raised).
Exits 77 ("skipped" for ctest) when jinja2 is missing.
"""
import json
import sys

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIPPED: python3-jinja2 is not installed (apt-get install python3-jinja2)")
    sys.exit(77)


def compile_template(source):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def drop_reasoning(messages):
    out = []
    for m in messages:
        if m["role"] == "assistant":
            m = dict(m)
            if "</think>" in m["content"]:
                m["content"] = m["content"].split("</think>")[-1].lstrip("\n")
            m["reasoning_content"] = ""
        out.append(m)
    return out


def main():
    path = sys.argv[1]
    with open(path, encoding="utf-8") as f:
        source = json.load(f)["chat_template"] if path.endswith(".json") else f.read()
    template = compile_template(source)
    out = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        messages = request["messages"]
        if request.get("drop_reasoning"):
            messages = drop_reasoning(messages)
        try:
            text = template.render(messages=messages, tools=None, documents=None,
                                   add_generation_prompt=request.get("add_generation_prompt", False),
                                   enable_thinking=request.get("enable_thinking", True))
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        except Exception as e:  # the template raised: the C side must refuse too
            out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
