#!/usr/bin/python3
"""Renders chat templates the way transformers' apply_chat_template does, for the agreement test of
SlideDP's own renderer (tests/text/chat_template_agreement_test.cc).

Reads JSON lines {"template": str, "variables": {...}} on stdin and writes one JSON line per input:
{"text": rendered} or {"error": message}. The environment is transformers' (utils/
chat_template_utils.py): Jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks,
the loop-controls extension, a {% generation %} tag, transformers' tojson (non-ASCII kept) and the
raise_exception and strftime_now globals. Needs Debian's python3-jinja2.
"""
import json
import sys
from datetime import datetime

from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    """{% generation %} ... {% endgeneration %}: rendered as its body (transformers records the span)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def raise_exception(message):
    raise ValueError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = environment()
    compiled = {}
    for line in sys.stdin:
        job = json.loads(line)
        try:
            source = job["template"]
            if source not in compiled:
                compiled[source] = env.from_string(source)
            out = {"text": compiled[source].render(**job["variables"])}
        except Exception as e:  # the test only needs to know that both sides refuse
            out = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
