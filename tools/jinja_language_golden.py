#!/usr/bin/env python3
"""Render small Jinja snippets with Python jinja2 under transformers' chat-template rules and
write tests/fixtures/chat_templates/language_golden.json, the spec for the language tests of
tests/template_language.rs.

Usage: python3 tools/jinja_language_golden.py [--check]

Needs jinja2 >= 3.1.6 only. The environment is the one of
tests/fixtures/chat_templates/make_golden.py (transformers' ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loop controls, {% generation %}, tojson = json.dumps, the
raise_exception / strftime_now / namespace / dict globals, the clock fixed at
2024-07-26 12:00:00). Each case renders with messages (default []), add_generation_prompt
(default False), tools = None, documents = None and its vars.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "chat_templates"))
import make_golden  # noqa: E402  (the environment and globals)
import jinja2  # noqa: E402

OUT = os.path.join(ROOT, "tests", "fixtures", "chat_templates", "language_golden.json")

MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <|im_end|> there"},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "think"},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]},
]

# (name, template, vars)  — vars may hold "messages" and "add_generation_prompt".
CASES = [
    # --- whitespace control, trim_blocks, lstrip_blocks, comments, raw
    ("ws_plain", "a\n{% if true %}\nb\n{% endif %}\nc\n", {}),
    ("ws_minus_both", "a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("ws_var_minus", "x  {{- 1 -}}  y\n\n{{ 2 }}\n", {}),
    ("ws_lstrip_indent", "  {% for i in [1,2] %}\n    {{ i }}\n  {% endfor %}\ndone", {}),
    ("ws_lstrip_not_after_text", "x {% if true %}y{% endif %}", {}),
    ("ws_plus_disables", "a\n  {%+ if true +%}\nb\n  {%+ endif %}\nc", {}),
    ("ws_comment_lines", "a\n  {# note #}\nb\n{#- strip -#}   \n c", {}),
    ("ws_trailing_newline_dropped", "line\n", {}),
    ("ws_two_trailing_newlines", "line\n\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("ws_tab_lstrip", "\t{% if true %}x{% endif %}", {}),
    ("ws_var_no_lstrip", "  {{ 'v' }}  \n", {}),
    ("ws_unicode_space_minus", "a\u00a0\u2003{{- 'b' }}", {}),
    ("raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}!", {}),
    ("raw_block_trim", "x\n  {%- raw -%}  {{ y }}  {%- endraw -%}  \nz", {}),
    ("comment_with_tags", "{# {{ x }} {% if %} #}ok", {}),
    ("string_raw_newline", "{{ 'a\nb' }}|{{ \"c\\nd\" }}", {}),
    ("string_escapes", r"{{ 'tab\tq\'dq\"bs\\x\x41\u00e9\101\q' }}", {}),
    ("string_adjacent", "{{ 'a' 'b' \"c\" }}", {}),
    # --- literals and printing (Python str)
    ("print_scalars", "{{ none }} {{ None }} {{ true }} {{ False }} {{ 1 }} {{ 1.0 }} {{ 1.5e-7 }} {{ 1e16 }} {{ 0.1 + 0.2 }}", {}),
    ("print_containers", "{{ [1, 'a', none, true, 2.0] }} {{ (1,) }} {{ () }} {{ {'k': 'v', 2: [3]} }}", {}),
    ("print_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}", {}),
    ("print_escapes_in_repr", "{{ ['a\\nb', 'tab\\t', 'é👋', '\\x00'] }}", {}),
    ("print_tuple_expr", "{{ 1, 2 }}", {}),
    ("print_data", "{{ d }} {{ d.a }} {{ l }}", {"d": {"a": 1.5, "b": None, "c": [True, "x"]}, "l": [1, 2]}),
    ("print_big_float", "{{ 123456789012345678.0 }} {{ 1e22 }} {{ -0.0 }} {{ 100.0 }}", {}),
    ("integers", "{{ 0x1F }} {{ 0o17 }} {{ 0b101 }} {{ 1_000_000 }}", {}),
    # --- arithmetic and operators
    ("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7.5 % 2 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}", {}),
    ("arith_mixed", "{{ 1 + 2.5 }} {{ true + 1 }} {{ 3 * 'ab' }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ 'x' ~ 1 ~ none ~ [2] }}", {}),
    ("unary", "{{ -3 }} {{ - -3 }} {{ +4 }} {{ -x|abs }} {{ not true }} {{ not not 0 }}", {"x": 5}),
    ("string_concat", "{{ 'a' + 'b' }}{{ [1] + [2] }}{{ (1,) + (2,) }}", {}),
    ("percent_format", "{{ '%s=%d (%.2f) %r %%' % ('a', 3, 2.5, 'q') }} {{ '%(x)s!' % {'x': 1} }} {{ '%5s|%-5s|%05d' % ('a', 'b', 42) }}", {}),
    ("and_or_values", "{{ 0 or 'x' }} {{ '' or [] }} {{ 1 and 'y' }} {{ none and 1 }} {{ 'a' or b }}", {}),
    ("compare_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }}", {}),
    ("in_operator", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 1 in (1,) }}", {}),
    ("cond_expr", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] {{ 'a' if 0 else 'b' if 1 else 'c' }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 'a' ~ (1 + 2) }} {{ 1 ~ 2 * 3 }}", {}),
    ("concat_binds_tighter_than_plus", "{{ 'a' ~ 1 + 2 }}", {}),
    ("filter_precedence", "{{ [1, 2, 3]|length - 1 }} {{ 'ab'|upper ~ 'c' }} {{ -3|abs }}", {}),
    # --- attribute / item access, slicing
    ("item_access", "{{ d['a'] }} {{ d.a }} {{ l[0] }} {{ l[-1] }} {{ l.0 }} {{ s[1] }} {{ s[-1] }} {{ t[1] }}", {"d": {"a": "A"}, "l": [1, 2, 3], "s": "xyz", "t": [[0, 1], [2, 3]]}),
    ("missing_prints_empty", "[{{ d.nope }}][{{ d['nope'] }}][{{ l[10] }}][{{ undefined_name }}]", {"d": {}, "l": []}),
    ("dict_method_vs_key", "{{ d.items()|list }} {{ d['items'] }} {{ d.get('x', 'dflt') }} {{ d.get('items') }}", {"d": {"items": "key!", "x": 1}}),
    ("slices", "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ l[1:3] }} {{ l[-2:] }} {{ l[5:] }} {{ s[1:] }} {{ s[::-1] }} {{ s[:n+1] }}", {"l": [1, 2, 3, 4, 5], "s": "héllo", "n": 1}),
    ("slice_negative_step", "{{ l[3:0:-1] }} {{ l[-1:-4:-2] }} {{ 'abcdef'[::3] }}", {"l": [1, 2, 3, 4, 5]}),
    ("attr_on_string", "[{{ 'abc'.nope }}] {{ 'abc'.upper() }}", {}),
    # --- statements: if/elif/else, for with everything, break/continue
    ("if_elif", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", {}),
    ("for_prev_next", "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ x }}|{{ loop.nextitem }}]{% endfor %}", {}),
    ("for_cycle_changed", "{% for x in [1, 1, 2, 2, 3] %}{{ loop.cycle('a', 'b', 'c') }}{% if loop.changed(x) %}*{% endif %}{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] if x > 5 %}x{% else %}filtered{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }}/{{ loop.length }} {% endfor %}", {}),
    ("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for a, (b, c) in [[1, [2, 3]]] %}{{ a }}{{ b }}{{ c }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_dict_iterates_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("for_nested_loop", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }}{{ b }} {% endfor %}{% endfor %}", {}),
    ("for_undefined_iterates_nothing", "[{% for x in nothing %}x{% endfor %}]", {}),
    ("for_recursive", "{% for n in tree recursive %}<{{ n.name }}{% if n.kids %}:{{ loop(n.kids) }}{% endif %}@{{ loop.depth }}>{% endfor %}", {"tree": [{"name": "a", "kids": [{"name": "b", "kids": []}, {"name": "c"}]}, {"name": "d"}]}),
    ("range_forms", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
    # --- scoping
    ("set_in_loop_does_not_leak", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = x + 10 %}{{ x }} {% endfor %}{{ x }}", {}),
    ("set_in_if_leaks", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("namespace_carries", "{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ ns }}", {}),
    ("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 3, 4 %}{{ c }}", {}),
    ("set_block", "{% set x %}  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]{% set y | upper %}shout{% endset %}{{ y }}", {}),
    ("with_block", "{% set a = 1 %}{% with a = 2, b = a %}{{ a }}{{ b }}{% endwith %}{{ a }}", {}),
    ("context_var_shadowed", "{{ x }}{% set x = 'local' %}{{ x }}", {"x": "ctx"}),
    ("loop_var_shadows_outer", "{% set i = 'out' %}{% for i in [1] %}{{ i }}{% endfor %}{{ i }}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}|{% filter trim | title %}  ab cd  {% endfilter %}", {}),
    ("generation_block", "a{% generation %}{% set z = 1 %}gen {{ z }}{% endgeneration %}[{{ z }}]", {}),
    # --- macros and calls
    ("macro_basic", "{% macro hi(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ hi('A') }} {{ hi('B', 'Hey') }} {{ hi(greeting='Yo', name='C') }}", {}),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}|{{ b }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(6) }}", {}),
    ("macro_calls_macro", "{% macro a(x) %}<{{ x }}>{% endmacro %}{% macro b(x) %}{{ a(x ~ '!') }}{{ a(x) }}{% endmacro %}{{ b('q') }}", {}),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ bos }}{% endmacro %}{{ m() }}", {"bos": "<s>"}),
    ("macro_default_uses_param", "{% macro m(a, b=a ~ '2') %}{{ a }}{{ b }}{% endmacro %}{{ m('x') }}", {}),
    ("macro_output_is_string", "{% macro m() %}  text  {% endmacro %}[{{ m()|trim }}]{{ m()|length }}", {}),
    ("call_block", "{% macro box(title) %}[{{ title }}:{{ caller() }}]{% endmacro %}{% call box('T') %}body {{ 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    ("macro_repr", "{% macro m() %}{% endmacro %}{{ m is defined }} {{ m is callable }}", {}),
    ("joiner_cycler", "{% set j = joiner(' | ') %}{% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %} {% set c = cycler('odd', 'even') %}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}", {}),
    # --- filters
    ("f_trim_strip", "[{{ '  a b \\n'|trim }}][{{ 'xxaxx'|trim('x') }}][{{ '\\u3000full\\u00a0'|trim }}]", {}),
    ("f_length_count", "{{ 'héllo'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ nothing|length }}", {}),
    ("f_string", "{{ [1, 'a']|string }} {{ none|string }} {{ {'a': [true]}|string }} {{ 1.0|string }}", {}),
    ("f_join", "{{ [1, 2, 3]|join(', ') }} {{ ['a', none, 1.5]|join }} {{ users|join(', ', attribute='name') }} {{ 'abc'|join('-') }}", {"users": [{"name": "x"}, {"name": "y"}]}),
    ("f_list_first_last", "{{ 'abc'|list }} {{ [3, 4]|first }} {{ [3, 4]|last }} {{ 'xyz'|first }} [{{ []|first }}] {{ {'a': 1, 'b': 2}|list }}", {}),
    ("f_case", "{{ 'hello wORLD-foo (bar)'|title }} {{ 'hELLO world'|capitalize }} {{ 'ß'|upper }} {{ 'ÀB'|lower }}", {}),
    ("f_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}", {}),
    ("f_default", "{{ nope|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ 0|d('z', boolean=true) }} {{ 'v'|d('d') }}", {}),
    ("f_select_reject", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ [1, 2, 3]|select('>', 1)|list }} {{ ['a', 'b']|reject('equalto', 'a')|list }}", {}),
    ("f_selectattr", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ msgs|rejectattr('role', 'in', ['user', 'system'])|list|length }} {{ msgs|selectattr('reasoning_content')|list|length }} {{ msgs|selectattr('reasoning_content', 'defined')|list|length }}", {"msgs": MSGS}),
    ("f_map", "{{ ['a', 'b']|map('upper')|list }} {{ users|map(attribute='name')|join(',') }} {{ users|map(attribute='age', default=0)|list }} {{ [' a ', 'b ']|map('trim')|list }} {{ ['x']|map('replace', 'x', 'y')|list }}", {"users": [{"name": "u1", "age": 3}, {"name": "u2"}]}),
    ("f_items_dictsort", "{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value') }} {{ d|dictsort(reverse=true) }} {{ {'B': 1, 'a': 2}|dictsort }} {{ {'B': 1, 'a': 2}|dictsort(true) }}", {"d": {"b": 2, "a": 3, "c": 1}}),
    ("f_sort_unique", "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ users|sort(attribute='age')|map(attribute='n')|join }} {{ ['a', 'A', 'b', 'a']|unique|list }} {{ users|sort(attribute='age,n')|map(attribute='n')|join }}", {"users": [{"n": "x", "age": 3}, {"n": "y", "age": 1}, {"n": "w", "age": 3}]}),
    ("f_min_max_sum", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ [1, 2.5]|sum }} {{ users|sum(attribute='age') }} {{ [[1], [2]]|sum(start=[]) }} [{{ []|max }}]", {"users": [{"age": 3}, {"age": 4}]}),
    ("f_reverse_abs_round", "{{ 'abc'|reverse }} {{ [1, 2]|reverse|list }} {{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(method='ceil') }} {{ 2.9|round(0, 'floor') }} {{ 5|round }} {{ 1234|round(-2) }}", {}),
    ("f_int_float", "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '0x1f'|int(0, 16) }} {{ 3.9|int }} {{ '2.5'|float }} {{ 'no'|float }} {{ 3|float }} {{ true|int }}", {}),
    ("f_indent", "{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}", {}),
    ("f_center_wordcount_truncate", "[{{ 'ab'|center(7) }}] {{ 'one two, three'|wordcount }} {{ 'hello world foo bar'|truncate(11) }} {{ 'hello world foo bar'|truncate(11, true) }} {{ 'hello'|truncate(3, true, '.', 0) }}", {}),
    ("f_escape_safe_format", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ 1|safe }} {{ '%s-%s'|format(1, 'b') }} {{ '%(a)s'|format(a='k') }}", {}),
    ("f_batch", "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 0)|list }}", {}),
    ("f_attr", "{% set ns = namespace(v=3) %}[{{ d|attr('a') }}] {{ ns|attr('v') }} {{ d|attr('items') is callable }}", {"d": {"a": 1}}),
    ("f_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}", {"d": {"b": [1, 2.0, None, True], "a": "é\"\\\n\t\u0001<>&'", "c": {}, "e": []}}),
    ("f_tojson_scalars", "{{ 'x'|tojson }} {{ 1|tojson }} {{ 1e-7|tojson }} {{ none|tojson }} {{ (1, 2)|tojson }} {{ {1: 'a', true: 'b'}|tojson }} {{ 'é'|tojson(true) }} {{ [1]|tojson(indent='\\t') }}", {}),
    ("f_tojson_nested_indent", "{{ m|tojson(indent=4) }}", {"m": MSGS}),
    # --- tests
    ("t_types", "{% for v in [1, 1.5, true, 'x', none, [1], {'a': 1}] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is boolean }}{{ v is string }}{{ v is none }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }}{{ v is true }}{{ v is false }};{% endfor %}", {}),
    ("t_defined", "{{ x is defined }} {{ y is defined }} {{ y is undefined }} {{ x is not defined }} {{ tools is defined }} {{ tools is none }} {{ documents is none }}", {"x": 0}),
    ("t_compare", "{{ 2 is eq 2 }} {{ 2 is equalto 3 }} {{ 2 is ne 3 }} {{ 2 is lt 3 }} {{ 2 is gt 3 }} {{ 2 is ge 2 }} {{ 2 is le 1 }} {{ 'a' is in 'abc' }} {{ 3 is in [1, 2] }}", {}),
    ("t_numbers", "{{ 3 is odd }} {{ 3 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 'aB' is lower }}", {}),
    ("t_misc", "{{ none is sameas none }} {{ range is callable }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'nope' is filter }} {{ nothing is iterable }}", {}),
    # --- Python methods
    ("m_split", "{{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  x  '.split(' ') }} {{ 'l1\\nl2\\r\\nl3'.splitlines() }}", {}),
    ("m_strip", "[{{ '  x  '.strip() }}][{{ '  x  '.lstrip() }}][{{ '  x  '.rstrip() }}][{{ '<<x>>'.strip('<>') }}][{{ '\\n\\tx\\x1f'.strip() }}]", {}),
    ("m_startswith", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} {{ 'hello'.startswith('l', 2) }} {{ 'hello'.endswith(('a', 'b')) }}", {}),
    ("m_find_count", "{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.index('l') }} {{ 'hello'.count('l') }} {{ 'a-b'.replace('-', '+') }} {{ 'aaa'.replace('a', 'b', 1) }}", {}),
    ("m_case_misc", "{{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'Ab'.swapcase() }} {{ 'x'.upper() }}{{ 'Y'.lower() }} {{ '42'.isdigit() }} {{ 'a1'.isalnum() }} {{ ' '.isspace() }} {{ ''.isdigit() }}", {}),
    ("m_join_pad", "{{ ', '.join(['a', 'b']) }} {{ '7'.zfill(3) }} {{ '-7'.zfill(4) }} {{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }}", {}),
    ("m_partition", "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }} {{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }}", {}),
    ("m_format", "{{ '{} and {}'.format('a', 'b') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{x}!'.format(x=1) }} {{ '{{}}'.format() }}", {}),
    ("m_dict", "{{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 0) }}", {"d": {"a": 1, "b": [2]}}),
    ("m_list", "{{ l.index(2) }} {{ l.count(1) }} {{ (1, 2, 2).count(2) }}", {"l": [1, 2, 1]}),
    # --- globals
    ("g_strftime", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j %p %I %y %e %-d %a %U %W') }}", {}),
    ("g_dict", "{{ dict(a=1, b='x') }} {{ dict([('k', 1)]) }} {{ dict({'a': 1}, b=2) }}", {}),
    ("g_raise_exception", "{% if true %}{{ raise_exception('Conversation roles must alternate user/assistant/...') }}{% endif %}", {}),
    ("g_raise_exception_nonstr", "{{ raise_exception(42) }}", {}),
    # --- messages, as transformers passes them
    ("messages_basic", "{% for m in messages %}{{ m.role }}:{{ m['content'] if m.content is string else m.content|selectattr('type', 'equalto', 'text')|map(attribute='text')|join }}|{% endfor %}{% if add_generation_prompt %}GEN{% endif %}", {"messages": MSGS, "add_generation_prompt": True}),
    ("messages_reasoning_alias", "{% for m in messages %}{{ m.thinking }}/{{ m.reasoning_content }}/{{ m|tojson }};{% endfor %}", {"messages": [{"role": "assistant", "content": "x", "reasoning": "r"}, {"role": "assistant", "thinking": "t", "content": "y"}]}),
    ("messages_loop_tricks", "{% for m in messages[::-1] %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %} {{ messages|length }} {{ messages[-1].role }} {{ (messages|last).content|length }}", {"messages": MSGS}),
    # --- undefined and errors
    ("undefined_ops_ok", "[{{ u }}][{{ u|length }}][{{ u|list }}][{{ u ~ 'x' }}][{{ u is none }}][{{ u == u }}][{{ u|default('d') }}][{{ u|string }}][{{ 'x' in u }}][{{ u|trim }}]", {}),
    ("err_attr_of_undefined", "{{ u.x }}", {}),
    ("err_item_of_undefined", "{{ u['x'] }}", {}),
    ("err_attr_of_missing_attr", "{{ d.a.b }}", {"d": {}}),
    ("err_call_undefined", "{{ u() }}", {}),
    ("err_undefined_plus", "{{ u + 1 }}", {}),
    ("err_str_plus_none", "{{ 'a' + none }}", {}),
    ("err_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("err_str_plus_undefined", "{{ 'a' + u }}", {}),
    ("err_list_plus_undefined_attr", "{{ [1] + d.x }}", {"d": {}}),
    ("str_mod_undefined", "[{{ '%s' % u }}]", {}),
    ("err_int_plus_str", "{{ 1 + 'a' }}", {}),
    ("err_list_plus_str", "{{ [1] + 'a' }}", {}),
    ("err_compare_types", "{{ 'a' < 1 }}", {}),
    ("err_div_zero", "{{ 1 / 0 }}", {}),
    ("err_mod_zero", "{{ 1 % 0 }}", {}),
    ("err_append_sandbox", "{% set l = [] %}{% set _ = l.append(1) %}{{ l }}", {}),
    ("err_dict_pop_sandbox", "{{ d.pop('a') }}", {"d": {"a": 1}}),
    ("err_namespace_underscore", "{% set ns = namespace(_x=1) %}", {}),
    ("err_namespace_set_underscore", "{% set ns = namespace() %}{% set ns._y = 1 %}", {}),
    ("err_set_attr_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("err_unpack", "{% set a, b = [1, 2, 3] %}", {}),
    ("err_unpack_few", "{% for a, b in [[1]] %}{% endfor %}", {}),
    ("err_not_iterable", "{% for x in 5 %}{% endfor %}", {}),
    ("err_range_too_big", "{{ range(100001)|length }}", {}),
    ("err_range_step_zero", "{{ range(1, 2, 0) }}", {}),
    ("err_tojson_undefined", "{{ u|tojson }}", {}),
    ("err_slice_step_zero", "{{ [1][::0] }}", {}),
    ("err_in_string_int", "{{ 1 in 'abc' }}", {}),
    ("err_unknown_filter_in_if", "{% if false %}{{ x|nosuchfilter }}{% endif %}ok", {}),
    ("err_unknown_filter_top", "{% if false %}x{% endif %}{{ x|nosuchfilter }}", {}),
    ("err_unknown_filter_loop_in_if", "{% if false %}{% for i in [1] %}{{ x|nosuchfilter }}{% endfor %}{% endif %}ok", {}),
    ("err_unknown_filter_in_condexpr", "{{ (x|nosuchfilter) if false else 'fine' }}", {}),
    ("err_unknown_test_top", "{{ x is nosuchtest }}", {}),
    ("err_unknown_test_in_if", "{% if x is defined and x is nosuchtest %}y{% endif %}ok", {}),
    ("err_unknown_filter_in_macro_unused", "{% macro m() %}{{ 1|nosuchfilter }}{% endmacro %}ok", {}),
    ("err_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
    ("err_macro_unknown_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(1, b=2) }}", {}),
    ("err_cond_without_else_used", "{{ ('x' if false).upper() }}", {}),
    ("err_loop_not_recursive", "{% for x in [1] %}{{ loop([1]) }}{% endfor %}", {}),
    ("err_int_overflow_free_in_python", "{{ (2 ** 62) * 2 }}", {}),
    # --- syntax errors
    ("syn_unclosed_for", "{% for x in y %}", {}),
    ("syn_unclosed_var", "{{ x ", {}),
    ("syn_unknown_tag", "{% frobnicate %}", {}),
    ("syn_endif_without_if", "{% endif %}", {}),
    ("syn_bad_expr", "{{ 1 + }}", {}),
    ("syn_unbalanced", "{{ (1 }}", {}),
    ("syn_unclosed_comment", "{# x", {}),
    ("syn_unclosed_string", "{{ 'abc }}", {}),
    ("syn_assign_const", "{% set true = 1 %}", {}),
    ("syn_test_operator_name", "{{ 2 is == 2 }}", {}),
    ("syn_chain_is", "{{ x is defined is defined }}", {}),

    # --- more whitespace and lexer corners
    ("ws_trim_only_newline", "{% if true %}   \nx{% endif %}|{% if true %}\n\ny{% endif %}", {}),
    ("ws_inline_blocks", "a {% if true %} b {% endif %} c\n  d {% if true %}e{% endif %}", {}),
    ("ws_start_of_template", "   {% if true %}x{% endif %}|  {{- 'y' }}", {}),
    ("ws_multiline_tag", "{% if\n  true\n  and 1 %}x{%\n endif\n %}\ny", {}),
    ("ws_minus_close_then_text", "{% if true -%}\n\n   z{%- endif %}", {}),
    ("ws_comment_lstrip_trim", "a\n    {# c #}\n    {#- d #}\nb", {}),
    ("ws_var_end_minus_newline", "{{ 'a' -}}\n  {% if true %}b{% endif %}", {}),
    ("lex_delims_in_strings", "{{ '{{' }}{{ '}}' }}{{ '{%' ~ '%}' }}{{ '{#' }}", {}),
    ("lex_nested_braces", "{% set x = {'a': {'b': {'c': 1}}} %}{{ x.a.b.c }}{{ {'k': 1}}}", {}),
    ("lex_colon_after_tag", "{% for x in [1, 2]: %}{{ x }}{% endfor %}", {}),
    ("lex_unicode_names", "{% set café = 'ok' %}{{ café }}", {}),
    ("lex_float_forms", "{{ 1.5e3 }} {{ 2E-2 }} {{ 1_0.0_1 }} {{ 3.0 }}", {}),
    # --- more expressions
    ("expr_tests_without_parens", "{{ 9 is divisibleby 3 }} {{ x is sameas none }} {{ 'a' is equalto 'a' }} {{ 1 is in [1, 2] }} {{ not x is none }} {{ not 1 in [2] }}", {"x": None}),
    ("expr_equality_types", "{{ u == none }} {{ u != 1 }} {{ none == none }} {{ [] == [] }} {{ {} == {} }} {{ (1,) == [1] }} {{ {'a': 1} == {'a': 1.0} }} {{ 'a' == 'a' }}", {}),
    ("expr_float_ops", "{{ 5 // 2.0 }} {{ 2.0 ** 0.5 }} {{ 10 % 3.5 }} {{ -5 // 2.5 }} {{ 1e308 * 10 }} {{ 7 / 7 }}", {}),
    ("expr_repeat_edge", "[{{ 'x' * 0 }}][{{ -1 * 'ab' }}][{{ [] * 3 }}][{{ 'ab' * true }}]", {}),
    ("expr_percent_none", "{{ '%s' % none }} {{ '%s|%s' % ([1], {'a': 2}) }} {{ 'Hello %s, you are %d' % ('Bob', 30) }} {{ '%i%%' % 5.9 }}", {}),
    ("expr_list_concat_len", "{% set x = [1, 2] + [3] %}{{ x|length }}{{ x[-1] }}", {}),
    ("expr_defined_guard", "{{ x.y if x.y is defined else 'no' }} {{ x.z }}", {"x": {"z": "zz"}}),
    ("expr_dup_dict_keys", "{{ {'a': 1, 'b': 2, 'a': 3} }}", {}),
    ("expr_unicode_escapes", "{{ 'a\\u00e9\\U0001F600\\x41' }} {{ '\\\\' }} {{ \"it's\" }}", {}),
    ("expr_string_ops", "{{ 'abc'[1:2] ~ 'x'[0] }} {{ 3|string + 'x' }} {{ ('a', 'b')|join }} {{ 'a' in ['a'] }}", {}),
    ("expr_messages_slice", "{{ messages[1].content[:5] }}|{{ messages[-1]['content'][0].text }}|{{ messages[1:]|map(attribute='role')|join(',') }}", {"messages": MSGS}),
    ("expr_tools_none", "{{ tools|tojson }} {{ documents is none }} {{ tools is not none }}", {}),
    ("expr_undefined_attr_default", "{{ (x.missing or 'fallback') }} {{ x.missing|default('d') }}", {"x": {}}),
    # --- more filters
    ("f_select_in", "{{ [1, 2, 3]|select('in', [2, 3])|list }} {{ [none, 1]|select('none')|list }} {{ msgs|selectattr('role', 'eq', 'user')|list|length }}", {"msgs": MSGS}),
    ("f_int_quirks", "{{ 1.0|int }} {{ '1e3'|int }} {{ ' 12 '|int }} {{ '-0x10'|int(base=16) }} {{ none|int }} {{ '3.99'|int }}", {}),
    ("f_round_halves", "{{ 0.5|round }} {{ 1.5|round }} {{ -0.5|round }} {{ 2.5|round(0) }} {{ 1.25|round(1) }} {{ 1250|round(-2) }} {{ 1350|round(-2) }} {{ 1234.5|round(-2) }}", {}),
    ("f_string_float", "{{ 10|float|string }} {{ 'abc'|replace('b', none) }} {{ 'a'|center(4) }}|", {}),
    ("f_chains", "{{ [3, 2, 1]|sort|first }} {{ {'b': 1, 'a': 2}|dictsort|first }} {{ 'Hello World'|lower|title }} {{ '  x'|trim|length }} {{ 'x'|indent(first=true) }}", {}),
    ("f_unicode_title", "{{ 'élan vital'|title }} {{ 'ÉCOLE'|capitalize }} {{ 'straße'|upper }}", {}),
    ("f_map_tojson", "{{ msgs|map('tojson')|join('\\n') }}", {"msgs": [{"a": 1}, [1, "x"]]}),
    ("f_dictsort_unicode", "{{ {'é': 1, 'e': 2, 'E': 3}|dictsort }}", {}),
    ("f_unique_attr", "{{ users|unique(attribute='n')|map(attribute='i')|list }}", {"users": [{"n": "a", "i": 1}, {"n": "A", "i": 2}, {"n": "b", "i": 3}]}),
    ("f_max_attr", "{{ (users|max(attribute='age')).n }} {{ (users|min(attribute='age')).n }}", {"users": [{"n": "x", "age": 3}, {"n": "y", "age": 1}, {"n": "z", "age": 3}]}),
    # --- more scoping and macros
    ("scope_macro_default_late", "{% macro m(a=g) %}{{ a }}{% endmacro %}{% set g = 1 %}{{ m() }}", {}),
    ("scope_macro_set_no_leak", "{% set v = 'out' %}{% macro m() %}{% set v = 'in' %}{{ v }}{% endmacro %}{{ m() }}{{ v }}", {}),
    ("scope_macro_in_loop", "{% for i in [1, 2] %}{% macro show() %}<{{ i }}>{% endmacro %}{{ show() }}{% endfor %}", {}),
    ("scope_varargs_len", "{% macro m() %}{{ varargs|length }}{% endmacro %}{{ m(1, 2) }}", {}),
    ("scope_nested_loops_set", "{% for a in [1, 2] %}{% set s = a %}{% for b in [10] %}{% set s = s + b %}{{ s }} {% endfor %}{{ s }};{% endfor %}", {}),
    ("scope_if_in_loop_set", "{% for a in [1, 2] %}{% if a == 1 %}{% set seen = 'yes' %}{% endif %}[{{ seen }}]{% endfor %}", {}),
    ("scope_loop_string_unicode", "{% for c in 'é👋a' %}[{{ c }}]{% endfor %}", {}),
    ("scope_namespace_in_macro", "{% set ns = namespace(c=0) %}{% macro bump() %}{% set ns.c = ns.c + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.c }}", {}),
    ("data_is_never_evaluated", "{{ m }}|{{ m|length }}", {"m": "{{ 7 * 7 }} {% if true %}x{% endif %} {# c #}"}),
    # --- strftime corners
    ("g_strftime_more", "{{ strftime_now('%%|%Z|%z|%D|%F|%T|%R|%r|%h|%C|%g|%G|%V|%k|%l|%P|%n|%t|%s') }}", {}),
    # --- where Python prints objects differently (known differences)
    ("known_range_repr", "{{ range(3) }}", {}),
    ("known_dict_items_repr", "{{ {'a': 1}.items() }}", {}),
    # --- odds and ends real templates do
    ("real_last_index", "{%- set ns = namespace(last=-1) -%}{%- for i in range(messages|length - 1, -1, -1) -%}{%- if messages[i].role == 'user' -%}{%- set ns.last = i -%}{%- break -%}{%- endif -%}{%- endfor -%}{{ ns.last }}", {"messages": MSGS}),
    ("real_think_split", "{%- set c = m.split('</think>')[-1].lstrip('\\n') -%}{%- set r = m.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}[{{ c }}][{{ r }}]", {"m": "<think>\nwhy\n</think>\n\nanswer"}),
    ("real_content_parts", "{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- elif part['type'] == 'image' or 'image' in part -%}<img>{%- endif -%}{%- endfor -%}", {"content": [{"type": "text", "text": "hi "}, {"type": "image"}, {"image": "x"}]}),
    ("real_tools_json", "{%- for t in tls -%}{{ t|tojson(indent=4) }}\n\n{%- endfor -%}", {"tls": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]}),
    ("real_date_default", "{%- if not date_string is defined -%}{%- if strftime_now is defined -%}{%- set date_string = strftime_now('%d %b %Y') -%}{%- else -%}{%- set date_string = '26 Jul 2024' -%}{%- endif -%}{%- endif -%}{{ date_string }}", {}),
    ("real_system_merge", "{%- if messages[0]['role'] == 'system' -%}{%- set system_message = messages[0]['content']|trim -%}{%- set messages = messages[1:] -%}{%- else -%}{%- set system_message = '' -%}{%- endif -%}[{{ system_message }}]{{ messages|length }}", {"messages": MSGS}),
    ("real_bos_eos", "{{ bos_token }}{% for m in messages %}{{ m.role }}{{ eos_token }}{% endfor %}", {"messages": MSGS, "bos_token": "<s>", "eos_token": "</s>"}),
    ("real_loop_messages_assert", "{%- for message in messages -%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}{%- endif -%}{%- endfor -%}ok", {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
]


def render_case(env, name, template, vars_):
    vars_ = dict(vars_)
    messages = make_golden.alias_reasoning_fields(vars_.pop("messages", []))
    agp = vars_.pop("add_generation_prompt", False)
    try:
        compiled = env.from_string(template)
        text = compiled.render(messages=messages, tools=None, documents=None, add_generation_prompt=agp, **vars_)
        return {"rendered": text}
    except Exception as e:  # noqa: BLE001 -- every failure is recorded
        return {"error": str(e), "error_type": type(e).__name__}


def main():
    env = make_golden.make_env()
    out = []
    names = set()
    for name, template, vars_ in CASES:
        assert name not in names, name
        names.add(name)
        entry = {"name": name, "template": template, "vars": vars_}
        entry.update(render_case(env, name, template, vars_))
        out.append(entry)
    text = json.dumps(out, ensure_ascii=False, indent=1) + "\n"
    if "--check" in sys.argv:
        with open(OUT, encoding="utf-8") as f:
            same = f.read() == text
        print(f"{len(out)} cases, " + ("matches" if same else "DIFFERS from") + " language_golden.json")
        return 0 if same else 1
    with open(OUT, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)
    errors = sum("error" in e for e in out)
    print(f"{len(out)} cases ({errors} errors) written to {os.path.relpath(OUT, ROOT)}; jinja2 {jinja2.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
