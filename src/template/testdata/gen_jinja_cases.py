#!/usr/bin/env python3
"""Regenerates jinja_cases.json: small templates rendered by jinja2 configured as transformers
configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, its own
tojson and raise_exception). Run: python3 gen_jinja_cases.py > jinja_cases.json"""
import json
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class AssistantTracker(Extension):
    """transformers' {% generation %} block, without the index tracking."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[AssistantTracker, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there \n"},
        {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1, "a": [1.5, None, True]}}}]},
        {"role": "user", "content": [{"type": "text", "text": "part"}, {"type": "image"}]}]

CASES = [
    ("text", "hello\n", {}),
    ("trailing_newlines", "a\n\n", {}),
    ("print_types", "{{ 1 }} {{ 1.0 }} {{ 0.1 }} {{ 1e20 }} {{ 2.5e-7 }} {{ none }} {{ true }} {{ False }} {{ 'x' }}", {}),
    ("print_containers", "{{ [1, 'a', none, 2.0] }} {{ {'k': 'v', 'n': [true]} }} {{ (1,) }} {{ (1, 'b') }}", {}),
    ("repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'a\\nb'] }}", {}),
    ("undefined_prints_empty", "[{{ nope }}][{{ msg.missing }}]", {"msg": {"a": 1}}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("lstrip_blocks", "x\n    {% if true %}\n    y\n    {% endif %}\nz", {}),
    ("lstrip_not_var", "x\n    {{ 'v' }}\n", {}),
    ("dash_control", "a   {%- if true -%}   b   {%- endif -%}   c {{- ' d ' -}} e", {}),
    ("plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}", {}),
    ("comment", "a {# comment #}\nb\n  {# c2 #}\nc", {}),
    ("raw", "{% raw %}{{ not parsed }}{% endraw %}!", {}),
    ("for_loop_vars", "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("for_prev_next", "{% for x in xs %}{{ loop.previtem | default('-') }}{{ x }}{{ loop.nextitem | default('-') }} {% endfor %}", {"xs": [1, 2, 3]}),
    ("for_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }} {% endfor %}", {}),
    ("for_dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("for_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}", {}),
    ("for_scope", "{% set y = 'out' %}{% for x in [1, 2] %}{% set y = x %}{{ y }}{% endfor %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for x in [1, 2, 3] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}", {}),
    ("set_block", "{% set b %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ b }}]", {}),
    ("set_block_filter", "{% set b | upper %}abc{% endset %}{{ b }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', punct='?') }} {{ greet(name='C') }}", {}),
    ("macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ x }}{% endcall %}", {"x": 7}),
    ("macro_sees_globals", "{% macro m() %}{{ g }}{% endmacro %}{% set g = 'late' %}{{ m() }}", {}),
    ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}", {}),
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1 + 2.5 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ -(3) }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ nope }} {{ 'a' + 'b' }} {{ [1] + [2] }}", {}),
    ("compare", "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 != 2 }} {{ 3 >= 3 }} {{ true == 1 }}", {}),
    ("logic", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ not 0 }} {{ none or [] }} {{ 1 if false }}|{{ 'y' if true else 'n' }}", {}),
    ("in_ops", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }}", {}),
    ("slicing", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ s[1:3] }} {{ s[-2:] }} {{ s[::-1] }}", {"xs": [1, 2, 3, 4], "s": "h\u00e9llo"}),
    ("indexing", "{{ xs[0] }} {{ xs[-1] }} {{ d['a'] }} {{ d.a }} {{ s[1] }} {{ xs.0 }}", {"xs": [1, 2], "d": {"a": "A"}, "s": "h\u00e9"}),
    ("string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"q\" }}|{{ 'u\\u00e9' }}|{{ 'nl\\n' }}", {}),
    ("str_methods", "{{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'hi  '.rstrip() }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}|{{ 'a-b'.replace('-', '+') }}|{{ 'hello world'.title() }}|{{ 'abcb'.count('b') }}|{{ 'abc'.find('c') }}|{{ ', '.join(['a', 'b']) }}", {}),
    ("str_split_think", "{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}", {"c": "<think>\nreason\n</think>\n\nanswer"}),
    ("dict_methods", "{{ d.get('a') }} {{ d.get('zz', 'def') }} {{ d.get('zz') }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }}", {"d": {"a": 1, "b": 2}}),
    ("filters_basic", "{{ ' x ' | trim }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ [1, 2, 3] | length }}|{{ 'h\u00e9' | length }}|{{ [3, 1] | first }}|{{ [3, 1] | last }}|{{ ['a', 'b'] | join('-') }}|{{ 'aXa' | replace('a', 'b') }}|{{ 42 | string }}|{{ '7' | int + 1 }}|{{ 'x' | int }}|{{ 3.7 | int }}|{{ '2.5' | float }}", {}),
    ("filter_default", "{{ nope | default('d') }}|{{ '' | default('d') }}|{{ '' | default('d', true) }}|{{ none | default('d') }}|{{ x | d('e') }}", {"x": 0}),
    ("filter_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'caf\u00e9 \"q\" <>' | tojson }}|{{ [1.0, 2, none, true] | tojson }}|{{ {} | tojson }}|{{ [] | tojson(indent=2) }}", {"d": {"b": [1, {"c": None}], "a": "x\ny"}}),
    ("filter_tojson_options", "{{ d | tojson(sort_keys=true) }}|{{ d | tojson(ensure_ascii=true) }}|{{ d | tojson(indent=1, sort_keys=true) }}", {"d": {"b": "caf\u00e9 \U0001F44D", "a": [1, {"d": 1, "c": 2}]}}),
    ("filter_tojson_separators", "{{ d | tojson(separators=(',', ':')) }}", {"d": {"b": [1, 2], "a": "x"}}),
    ("filter_map_select", "{{ ms | map(attribute='role') | list }}|{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}|{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}|{{ [1, 2, 3, 4] | select('even') | list }}|{{ [1, 0, 2] | select | list }}|{{ ['a', 'B'] | map('upper') | list }}", {"ms": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]}),
    ("filter_selectattr_defined", "{{ ms | selectattr('tool_calls', 'defined') | list | length }}", {"ms": [{"role": "user"}, {"role": "assistant", "tool_calls": []}]}),
    ("filter_items_dictsort", "{{ d | items | list }}|{{ d | dictsort }}|{{ d | dictsort(reverse=true) }}", {"d": {"b": 1, "a": 2, "C": 3}}),
    ("filter_sort_unique", "{{ [3, 1, 2] | sort }}|{{ ['b', 'A', 'c'] | sort }}|{{ ['b', 'A', 'c'] | sort(case_sensitive=true) }}|{{ [3, 1] | sort(reverse=true) }}|{{ [1, 2, 1, 3] | unique | list }}|{{ ms | sort(attribute='n') | map(attribute='n') | list }}", {"ms": [{"n": 2}, {"n": 1}]}),
    ("filter_indent", "{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) }}|{{ 'x\\ny' | indent('> ') }}", {}),
    ("filter_misc", "{{ [1, 2, 3] | sum }}|{{ [1, 5, 2] | max }}|{{ [1, 5, 2] | min }}|{{ -3 | abs }}|{{ 2.5 | round }}|{{ 3.14159 | round(2) }}|{{ [1, 2] | reverse | list }}|{{ 'abc' | reverse }}|{{ 'a b  c' | wordcount }}|{{ 'x' | center(5) }}|{{ 'hello world' | capitalize }}|{{ 'a<b' | e }}|{{ [1,2,3,4,5] | batch(2) | list }}", {}),
    ("tests", "{{ x is defined }}{{ nope is defined }}{{ nope is undefined }}{{ none is none }}{{ 'a' is string }}{{ 1 is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ 1 is number }}{{ 1.5 is number }}{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ false is false }}{{ 1 is true }}{{ [] is sequence }}{{ 4 is divisibleby 2 }}{{ 3 is odd }}{{ 3 is even }}{{ 'a' is lower }}{{ 'A' is upper }}{{ x is not none }}{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 1 is in [1] }}{{ x is sameas x }}", {"x": 1}),
    ("messages_like", "{% for m in messages %}{% if m.content is string %}{{ m.role }}: {{ m.content | trim }}\n{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}\n{% endif %}{% if m.tool_calls is defined %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments | tojson }})\n{% endfor %}{% endif %}{% endfor %}", {"messages": MSGS}),
    ("messages_slice_reverse", "{% for m in messages[1:][::-1] %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %}{{ (messages | length) - 1 }}", {"messages": MSGS}),
    ("dict_literal_nested_close", "{{ {'a': {'b': 1}} }}{{ {'a': {'b': 1}}['a']['b'] }}", {}),
    ("filter_precedence", "{{ 'a' + ' b ' | trim + 'c' }}{{ -2 | abs }}{{ [1, 2] | length * 3 }}", {}),
    ("cond_chain", "{{ 'a' if x == 1 else 'b' if x == 2 else 'c' }}{{ x if x }}", {"x": 2}),
    ("string_concat_adjacent", "{{ 'a' 'b' \"c\" }}", {}),
    ("none_tools", "{% if tools %}T{% endif %}{% if tools is none %}N{% endif %}{% if tools is defined %}D{% endif %}", {"tools": None}),
    ("percent_format", "{{ '%s-%d' % ('a', 3) }}|{{ '%s!' % 'x' }}|{{ '%s' | format(5) }}", {}),
    ("percent_format_specs", "{{ '%.2f|%5d|%-4s|%05.1f|%x|%e|%%' % (3.14159, 42, 'ab', 2.25, 255, 12345.678) }}", {}),
    ("str_format", "{{ '{} and {}'.format('a', 1) }}|{{ '{1}{0}'.format('x', 'y') }}|{{ '{n}!'.format(n=5) }}|{{ '{{}}'.format() }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}", {}),
    ("macro_default_from_param", "{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('x') }}{{ m('x', 'y') }}", {}),
    ("macro_recursive", "{% macro walk(n) %}{{ n.name }}{% if n.kids %}({% for k in n.kids %}{{ walk(k) }}{% if not loop.last %},{% endif %}{% endfor %}){% endif %}{% endmacro %}{{ walk(tree) }}", {"tree": {"name": "r", "kids": [{"name": "a"}, {"name": "b", "kids": [{"name": "c"}]}]}}),
    ("call_with_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}<{{ item }}>{% endcall %}", {}),
    ("globals_dict_joiner", "{% set d = dict(a=1, b='x') %}{{ d }}{% set j = joiner('+') %}{% for x in [1, 2, 3] %}{{ j() }}{{ x }}{% endfor %}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}", {}),
    ("ns_list_accumulate", "{% set ns = namespace(items=[]) %}{% for m in ms %}{% set ns.items = ns.items + [m.role] %}{% endfor %}{{ ns.items | join(',') }}", {"ms": [{"role": "a"}, {"role": "b"}]}),
    ("not_is_defined_precedence", "{% if not x is defined %}undef{% endif %}{% if not y is defined %}Y{% endif %}", {"y": 1}),
    ("loop_depth_changed_free", "{% for x in [1] %}{{ loop.depth }}{{ loop.depth0 }}{% endfor %}", {}),
    ("none_attr_printing", "[{{ n.x }}][{{ d.k.x is defined }}]", {"n": None, "d": {"k": None}}),
    ("items_unpack_in_set", "{% for pair in d | dictsort %}{% set k, v = pair %}{{ k }}{{ v }}{% endfor %}", {"d": {"b": 2, "a": 1}}),
    ("inline_if_nested_filters", "{{ (xs | map('string') | join('/')) if xs else 'none' }}", {"xs": [1, 2.5, None]}),
    ("int_float_arith_print", "{{ 10 / 4 }} {{ 10 // 4 }} {{ 2 ** 0.5 }} {{ 1e3 }} {{ 3 * 1.0 }} {{ 7 % 2.5 }} {{ -1 ** 2 }}", {}),
    ("big_ints", "{{ n }} {{ n * 2 }} {{ n | tojson }}", {"n": 9007199254740993}),
    ("unicode_methods", "{{ '\u00c9t\u00e9' | lower }} {{ '\u00e9t\u00e9' | upper }} {{ '\u00e9t\u00e9'[1:] }} {{ '\u00e9t\u00e9' | length }} {{ '  \u3000x\u3000 ' | trim }}|", {}),
    ("strip_multibyte", "[{{ s.strip('\uff5c') }}][{{ s.lstrip('\uff5c') }}][{{ s.rstrip('\uff5cx') }}][{{ w | trim }}][{{ w.rstrip() }}][{{ '\u00e9\u00e9a\u00e9'.strip('\u00e9') }}]", {"s": "\uff5c\uff5cx\u00e9x\uff5c", "w": "\u2003\u00a0 caf\u00e9\n\u3000"}),
    ("loop_recursive", "{% for n in tree recursive %}{{ loop.depth }}{{ n.name }}{% if n.kids %}({{ loop(n.kids) }}){% endif %}{% endfor %}", {"tree": [{"name": "r", "kids": [{"name": "a"}, {"name": "b", "kids": [{"name": "c"}]}]}, {"name": "s"}]}),
    ("loop_changed", "{% for x in [1, 1, 2, 2, 1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", {}),
    ("filter_truncate_slice", "{{ long | truncate(20) }}|{{ long | truncate(20, true) }}|{{ long | truncate(20, end='~') }}|{{ 'short' | truncate(3, leeway=5) }}|{{ 'h\u00e9llo w\u00f6rld again' | truncate(12, leeway=0) }}|{{ [1, 2, 3, 4, 5] | slice(2) | list }}|{{ [1, 2, 3, 4, 5] | slice(3, 0) | list }}", {"long": "the quick brown fox jumps over the lazy dog"}),
    ("loop_over_string", "{% for c in 'h\u00e9y' %}[{{ c }}]{% endfor %}", {}),
    ("do_generation_free", "{% set x = 1 %}{% generation %}gen{% set x = 2 %}{{ x }}{% endgeneration %}{{ x }}", {}),
    ("with_block", "{% set a = 'outer' %}{% with a = 'inner', b = a ~ '!' %}{{ a }}{{ b }}{% set c = 1 %}{% endwith %}{{ a }}{{ c }}", {}),
    ("float_print", "{{ 100.0 }} {{ 1e16 }} {{ 1.5e15 }} {{ 123456789.125 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }} {{ 3.0 * 1.1 }}", {}),
    ("json_numbers", "{{ v }} {{ v | tojson }} {{ n }} {{ n | tojson }}", {"v": 21.0, "n": 10000000000}),
    ("whitespace_mixed", "<s>\n{%- for m in ms %}\n  {{ m }}\n{%- endfor %}\n</s>", {"ms": [1, 2]}),
    ("block_set_scope_in_loop", "{% for x in [1, 2] %}{% set c %}{{ x }}{{ x }}{% endset %}{{ c }}{% endfor %}", {}),
    ("join_attribute", "{{ ms | join(', ', attribute='n') }}", {"ms": [{"n": 1}, {"n": 2}]}),
    ("list_string_filter", "{{ 'abc' | list }}{{ {'a': 1} | list }}", {}),
    ("loop_nested", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    # Errors: the reference fails, so must we.
    ("err_raise", "{{ raise_exception('boom') }}", {}),
    ("err_undefined_attr", "{{ nope.x }}", {}),
    ("err_list_method", "{{ xs.startswith('a') }}", {"xs": [1]}),
    ("err_concat", "{{ 'a' + xs }}", {"xs": [1]}),
    ("err_append", "{% set xs = [] %}{{ xs.append(1) }}", {}),
    ("err_add_undefined", "{{ 1 + nope }}", {}),
    ("err_unknown_filter", "{{ 1 | nosuchfilter }}", {}),
    ("err_syntax", "{% if %}", {}),
    ("unknown_test_in_if_unreached", "{% if false %}{{ x is nosuchtest }}{% endif %}ok", {}),
    ("unknown_filter_in_if_unreached", "{% if false %}{{ x | nope }}{% elif false %}{{ x | nope }}{% else %}{% set y = x | nope if false %}{% endif %}ok", {}),
    ("unknown_filter_in_condexpr", "{{ (x | nope) if false else 'ok' }}{% for a in [] %}{% if false %}{{ x | nope }}{% endif %}{% endfor %}", {}),
    ("err_unknown_filter_in_if_test", "{% if x | nope %}{% endif %}ok", {}),
    ("err_unknown_filter_loop_in_if", "{% if false %}{% for a in b %}{{ x | nope }}{% endfor %}{% endif %}ok", {}),
    ("err_unknown_filter_macro_in_if", "{% if false %}{% macro m() %}{{ x | nope }}{% endmacro %}{% endif %}ok", {}),
    ("err_unknown_filter_block_in_if", "{% if false %}{% filter nope %}a{% endfilter %}{% endif %}ok", {}),
    ("err_unknown_filter_setblock_in_if", "{% if false %}{% set y %}{{ x | nope }}{% endset %}{% endif %}ok", {}),
    ("err_unknown_test_in_macro", "{% macro m() %}{{ x is nope }}{% endmacro %}ok", {}),
    ("err_unclosed", "{% for x in y %}", {}),
    ("err_iterate_none", "{% for x in none %}{% endfor %}", {}),
    ("err_div_zero", "{{ 1 // 0 }}", {}),
]

out = []
for name, source, ctx in CASES:
    case = {"name": name, "template": source, "context": ctx}
    try:
        case["expected"] = env.from_string(source).render(**ctx)
    except Exception as e:  # noqa: BLE001 - the reference failing is the expectation
        case["error"] = f"{type(e).__name__}: {e}"
    out.append(case)
json.dump({"jinja2": jinja2.__version__, "cases": out}, sys.stdout, ensure_ascii=False, indent=1)
sys.stdout.write("\n")
