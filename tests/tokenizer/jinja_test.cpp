// The Jinja interpreter against jinja2 itself: every expected string below
// was rendered by jinja2 3.1.6 configured as transformers' chat template
// environment (ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks,
// loopcontrols, the `generation` tag, and transformers' tojson,
// raise_exception and strftime_now), over the context kContext.
#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/template.h"

namespace augur {
namespace {

const char* const kContext = R"json(
{"xs": [1, 2, 3], "d": {"a": 1, "b": [1, 2]}, "s": "Hello World", "n": null, "msgs": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}], "u": "héllo wörld ß", "f": 2.5, "t": true}
)json";

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(kContext);
  return ctx;
}

std::string render(const std::string& source, const nlohmann::ordered_json& ctx = context()) {
  return jinja::Template(source, "chat_template").render(ctx);
}

struct RenderCase {
  const char* name;
  const char* source;
  const char* expected;
};

const RenderCase kRenderCases[] = {
    {"text_only",
     "plain text",
     "plain text"},
    {"trailing_newline_dropped",
     "a\n",
     "a"},
    {"crlf_normalized",
     "a\r\nb\rc",
     "a\nb\nc"},
    {"print_literals",
     "{{ 'str' }} {{ \"dq\" }} {{ 42 }} {{ -7 }} {{ 1.5 }} {{ true }} {{ False }} {{ none }} {{ None }}",
     "str dq 42 -7 1.5 True False None None"},
    {"string_escapes",
     "{{ 'tab\\there' }}|{{ \"q\\\"uote\" }}|{{ 'it\\'s' }}|{{ '\\u00e9\\x41\\101' }}|{{ 'back\\\\slash' }}|{{ 'unk\\qx' }}|{{ \"a\" 'b' }}",
     "tab\there|q\"uote|it's|éAA|back\\slash|unk\\qx|ab"},
    {"number_literals",
     "{{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e3 }} {{ 2e-3 }}",
     "1000 31 5 15 1500.0 0.002"},
    {"python_str_of_values",
     "{{ [1, 'a', none, true, 1.0] }} {{ (1,) }} {{ (1, 2) }} {{ {'a': 1, 'b': [2]} }} {{ ['it\\'s', \"q\\\"\"] }}",
     "[1, 'a', None, True, 1.0] (1,) (1, 2) {'a': 1, 'b': [2]} [\"it's\", 'q\"']"},
    {"float_repr",
     "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ -0.0 }} {{ 123456789.123 }}",
     "1e+16 1000000000000000.0 0.0001 1e-05 0.30000000000000004 0.3333333333333333 -0.0 123456789.123"},
    {"arithmetic",
     "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }}",
     "14 20 3.5 3 -4 2 -2 1.5 1024 0.5 64 4 5"},
    {"string_and_list_operators",
     "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 3 * 'x' }} {{ [1] * 2 }} {{ [1, 2] + [3] }} {{ (1,) + (2,) }} {{ 'a' ~ 1 ~ none }}",
     "ab ababab xxx [1, 1] [1, 2, 3] (1, 2) a1None"},
    {"comparisons",
     "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ [1, 2] == [1, 2] }} {{ (1, 2) == [1, 2] }} {{ [1] < [1, 2] }} {{ 'b' > 'a' }} {{ 2 >= 2.0 }}",
     "True False True True True True False True True True"},
    {"membership",
     "{{ 2 in xs }} {{ 5 not in xs }} {{ 'a' in d }} {{ 'ell' in s }} {{ 'z' not in 'abc' }} {{ 'x' in undefined_name }}",
     "True True True True True False"},
    {"boolean_operators",
     "{{ 1 or 2 }} {{ 0 or 'x' }} {{ 0 and 1 }} {{ '' and 1 }} {{ not true }} {{ not none is none }} {{ undefined_name or 'fallback' }}",
     "1 x 0  False False fallback"},
    {"precedence_filters_bind_tighter",
     "{{ xs|length - 1 }} {{ 'a' ~ 1 * 2 }} {{ -3|abs }}",
     "2 a2 3"},
    {"conditional_expression",
     "{{ 'x' if none else 'y' }} {{ 'x' if 1 }} {{ 1 if true else 2 if false else 3 }}[{{ 'x' if false }}]",
     "y x 1[]"},
    {"attribute_and_subscript",
     "{{ d.a }} {{ d['a'] }} {{ d.b.1 }} {{ d['b'][0] }} {{ xs.0 }} {{ msgs[1].role }} {{ msgs[1]['content'] }} [{{ d.missing }}] [{{ d['missing'] }}] [{{ xs[10] }}] [{{ n.attr }}]",
     "1 1 2 1 1 user hi [] [] [] []"},
    {"slicing",
     "{{ xs[1:] }} {{ xs[::-1] }} {{ xs[-1] }} {{ xs[:2] }} {{ xs[none:2] }} {{ xs[-10:2] }} {{ (1, 2, 3)[::2] }} {{ 'héllo'[1:3] }} {{ 'héllo'[1] }} {{ 'hello'[-3:] }} {{ u[::-1] }}",
     "[2, 3] [3, 2, 1] 3 [1, 2] [1, 2] [1, 2] (1, 3) él é llo ß dlröw olléh"},
    {"undefined_behaviour",
     "[{{ undefined_name }}] {{ undefined_name is defined }} {{ undefined_name is undefined }} {{ undefined_name|length }} {{ undefined_name|list }} [{{ undefined_name|join }}] {{ undefined_name is none }} {{ undefined_name == none }} {{ 'a' ~ undefined_name ~ 'b' }}",
     "[] False True 0 [] [] False False ab"},
    {"if_elif_else",
     "{% for x in xs %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %},{% endfor %}",
     "one,two,other,"},
    {"for_loop_variables",
     "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
     "1032TrueFalse3|2121FalseFalse3|3210FalseTrue3|"},
    {"for_loop_prev_next_cycle",
     "{% for x in xs %}[{{ loop.previtem }},{{ loop.nextitem }},{{ loop.cycle('a', 'b') }}]{% endfor %}",
     "[,2,a][1,3,b][2,,a]"},
    {"for_else",
     "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in xs %}{{ x }}{% else %}no{% endfor %}",
     "empty123"},
    {"for_inline_filter",
     "{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }},{% endfor %}",
     "1/2:2,2/2:3,"},
    {"for_unpacking_items",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d|items %}{{ k }};{% endfor %}{% for (a, b) in [(1, 2), (3, 4)] %}{{ a + b }}{% endfor %}",
     "a=1;b=[1, 2];a;b;37"},
    {"for_over_dict_and_string",
     "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'hé' %}[{{ c }}]{% endfor %}|{% for x in undefined_name %}x{% endfor %}",
     "ab|[h][é]|"},
    {"for_break_continue",
     "{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}",
     "1"},
    {"nested_loops_shadow_loop",
     "{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}|{{ loop.index }}{% endfor %}",
     "123|1123|2123|3"},
    {"set_does_not_leak_from_loop",
     "{% set z = 'outer' %}{% for i in xs %}{% set z = i %}{{ z }}{% endfor %}{{ z }}",
     "123outer"},
    {"set_tuple_unpacking",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 3, 4 %}{{ t }}",
     "12(3, 4)"},
    {"block_set",
     "{% set x %}hello {{ 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}",
     "[hello 1]ABC"},
    {"namespace",
     "{% set ns = namespace(a=1, found=false) %}{% for x in xs %}{% set ns.a = ns.a + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.a }} {{ ns.found }}",
     "7 True"},
    {"namespace_list_accumulation",
     "{% set ns = namespace(v=[]) %}{% for m in msgs %}{% set ns.v = ns.v + [m.role] %}{% endfor %}{{ ns.v|join(',') }}",
     "system,user,assistant"},
    {"macros",
     "{% macro f(a, b=2) %}{{ a }}-{{ b }}{% endmacro %}{{ f(1) }} {{ f(1, 3) }} {{ f(b=5, a=0) }} [{{ f() }}]",
     "1-2 1-3 0-5 [-2]"},
    {"macro_calls_macro",
     "{% macro a(x) %}<{{ b(x) }}>{% endmacro %}{% macro b(y) %}[{{ y|upper }}]{% endmacro %}{{ a('q') }}",
     "<[Q]>"},
    {"macro_sees_later_top_level_set",
     "{% set x = 1 %}{% macro f() %}{{ x }}{% endmacro %}{% set x = 2 %}{{ f() }}",
     "2"},
    {"generation_tag",
     "{% generation %}gen {{ 1 }}{% endgeneration %}",
     "gen 1"},
    {"filter_block",
     "{% filter upper %}abc {{ 'd' }}{% endfilter %}",
     "ABC D"},
    {"raw_block",
     "{% raw %}{{ not processed }}{% endraw %}",
     "{{ not processed }}"},
    {"comments",
     "a {# comment #}b {#- trimmed -#} c",
     "a bc"},
    {"whitespace_control_dash",
     "a  {{- 'b' -}}  c {%- if true %} d {% endif -%}  e",
     "abc d e"},
    {"trim_blocks",
     "{% if true %}\nx\n{% endif %}\ny",
     "x\ny"},
    {"lstrip_blocks",
     "line1\n    {% for i in xs %}\n    item {{ i }}\n    {% endfor %}\nend",
     "line1\n    item 1\n    item 2\n    item 3\nend"},
    {"lstrip_blocks_not_for_print_or_midline",
     "a  {% if true %}x{% endif %}\n  {{ 'y' }}",
     "a  x  y"},
    {"plus_disables_lstrip_and_trim",
     "  {%+ if true %}a{% endif +%}\nb",
     "  a\nb"},
    {"comment_lstrip_and_trim",
     "  {# c #}\nz",
     "z"},
    {"filters_strings",
     "{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'AbC'|upper }}|{{ 'AbC'|lower }}|{{ 'hELLO wORLD'|capitalize }}|{{ 'hello-world (foo) [bar]x'|title }}|{{ s|replace('l', 'L', 2) }}|{{ 'a b\\tc'|wordcount }}|{{ 'hello'|center(9) }}|",
     "x|a|ABC|abc|Hello world|Hello-World (Foo) [Bar]x|HeLLo World|3|  hello  |"},
    {"filters_unicode",
     "{{ u|upper }} {{ u|title }} {{ u|capitalize }} {{ u|length }} {{ u|wordcount }}",
     "HÉLLO WÖRLD SS Héllo Wörld SS Héllo wörld ß 13 3"},
    {"filters_sequences",
     "{{ xs|length }} {{ d|count }} {{ xs|first }} {{ xs|last }} {{ 'abc'|last }} {{ d|first }} {{ xs|join(',') }} {{ xs|reverse|list }} {{ 'abc'|reverse }} {{ 'ab'|list }} {{ d|list }}",
     "3 2 1 3 c a 1,2,3 [3, 2, 1] cba ['a', 'b'] ['a', 'b']"},
    {"filters_sort_unique",
     "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a']|sort }} {{ ['x', 'Y']|sort(reverse=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n')|map(attribute='n')|list }} {{ ['b', 'A', 'a']|unique|list }} {{ ['a', 'A']|unique(case_sensitive=true)|list }}",
     "[1, 2, 3] ['A', 'a', 'b'] ['Y', 'x'] [1, 2] ['b', 'A'] ['a', 'A']"},
    {"filters_map_select",
     "{{ [{'a': 1}, {'a': 2}]|map(attribute='a')|join }} {{ ['a', 'b']|map('upper')|list }} {{ ['a', 'b']|map('replace', 'a', 'z')|list }} {{ xs|select('odd')|list }} {{ xs|reject('odd')|list }} {{ [{'a': 1}, {'a': 0}]|selectattr('a')|list }}",
     "12 ['A', 'B'] ['z', 'b'] [1, 3] [2] [{'a': 1}]"},
    {"filters_map_select_of_false_values",
     "{{ none|map(attribute='a')|list }} {{ none|selectattr('type', 'equalto', 'x')|list }} {{ 0|select|list }} {{ ''|reject('odd')|list }} {{ undefined_name|map('upper')|list }} {{ none|map|list }}",
     "[] [] [] [] [] []"},
    {"filters_selectattr_tests",
     "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ msgs|selectattr('tool_calls', 'defined')|list|length }} {{ msgs|map(attribute='tool_calls', default='none')|list|length }}",
     "['hi'] 2 1 3"},
    {"filters_numbers",
     "{{ -2|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 3.7|round(0, 'floor') }} {{ xs|sum }} {{ xs|sum(start=10) }} {{ xs|max }} {{ xs|min }}",
     "2 2.0 4.0 5 2.67 3.0 3.0 6 16 3 1"},
    {"filters_conversions",
     "{{ '42'|int }} {{ '4.5'|int }} {{ 'x'|int }} {{ 4.9|int }} {{ '3'|float }} {{ 'x'|float }} {{ none|string }} {{ xs|string }} {{ 3|float }}",
     "42 4 0 4 3.0 0.0 None [1, 2, 3] 3.0"},
    {"filters_default",
     "{{ undefined_name|default('dflt') }} {{ none|default('dflt') }} {{ none|default('dflt', true) }} {{ ''|d('e', true) }} {{ 0|default(5) }}",
     "dflt None dflt e 0"},
    {"filters_items_dictsort_batch",
     "{{ d|items|list }} {{ d|dictsort }} {{ xs|batch(2)|list }} {{ xs|batch(2, 0)|list }}",
     "[('a', 1), ('b', [1, 2])] [('a', 1), ('b', [1, 2])] [[1, 2], [3]] [[1, 2], [3, 0]]"},
    {"filters_indent",
     "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x'|indent }}",
     "a\n  b\n\n  c|  a\n  b|a\n  \n  b|x"},
    {"filters_escape_safe_format",
     "{{ '<a href=\"x\">&\\''|e }} {{ 'x'|safe }} {{ '%s-%d'|format('a', 3) }} {{ 'hello world foo'|truncate(9) }}",
     "&lt;a href=&#34;x&#34;&gt;&amp;&#39; x a-3 hello..."},
    {"tojson_defaults",
     "{{ d|tojson }} {{ 'é\\n\"'|tojson }} {{ 1.5|tojson }} {{ [1.0, 1e20, -0.0, none, true]|tojson }} {{ msgs[2]|tojson }}",
     "{\"a\": 1, \"b\": [1, 2]} \"é\\n\\\"\" 1.5 [1.0, 1e+20, -0.0, null, true] {\"role\": \"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}"},
    {"tojson_options",
     "{{ d|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ {'a': []}|tojson(indent=2) }}|{{ [[]]|tojson(indent='\\t') }}|{{ xs|tojson(4) }}",
     "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2\n  ]\n}|{\"a\": 2, \"b\": 1}|\"\\u00e9\\ud83d\\ude00\"|{\"a\":1,\"b\":[1,2]}|{\n  \"a\": []\n}|[\n\t[]\n]|[1, 2, 3]"},
    {"tests",
     "{{ n is none }} {{ xs is iterable }} {{ d is mapping }} {{ xs is mapping }} {{ true is number }} {{ true is integer }} {{ 1 is integer }} {{ 1.0 is float }} {{ 's' is string }} {{ xs is sequence }} {{ true is boolean }} {{ true is true }} {{ 1 is true }} {{ false is false }}",
     "True True True False True False True True True True True True False True"},
    {"tests_with_arguments",
     "{{ 3 is divisibleby 3 }} {{ 7 is divisibleby(2) }} {{ 'a' is in 'abc' }} {{ 1 is in [1] }} {{ 3 is odd }} {{ 4 is even }} {{ 3 is ge 3 }} {{ 3 is lt 2 }} {{ 'a' is equalto 'a' }} {{ 2 is eq 3 }} {{ 'A' is upper }} {{ 'a' is lower }} {{ xs is sameas xs }}",
     "True False True True True True True False True False True True True"},
    {"tests_negated",
     "{{ xs is not none }} {{ n is not none }} {{ xs[9] is not defined }} {{ 'x' is not string }}",
     "True False True False"},
    {"str_methods",
     "{{ 'a b'.startswith('a') }} {{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith('bc') }} {{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(none, 1) }} {{ 'a-b-c'.rsplit('-', 1) }} {{ 'a\\nb'.splitlines() }}",
     "True True True ['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b c'] ['a-b', 'c'] ['a', 'b']"},
    {"str_methods_strip_replace",
     "[{{ '  x '.strip() }}][{{ '  x '.lstrip() }}][{{ '  x '.rstrip() }}][{{ 'xxaxx'.strip('x') }}][{{ '\\n\\nx\\n'.lstrip('\\n') }}] {{ 'abc'.replace('b', 'B') }} {{ 'aaa'.replace('a', 'b', 2) }}",
     "[x][x ][  x][a][x\n] aBc bba"},
    {"str_methods_misc",
     "{{ 'AbC'.lower() }} {{ 'abc'.upper() }} {{ \"hello world's\".title() }} {{ 'abc'.capitalize() }} {{ 'abc'.find('c') }} {{ 'abc'.find('z') }} {{ 'abca'.count('a') }} {{ 'x'.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'abc'.removeprefix('a') }}",
     "abc ABC Hello World'S Abc 2 -1 2 axb True True bc"},
    {"str_format",
     "{{ '{}+{}'.format(1, 2) }} {{ '{0}{name}'.format(1, name='x') }} {{ '{!r}'.format('x') }} {{ '{0[a]}'.format(d) }} {{ '%s and %r' % ('a', 'b') }} {{ '%d%%' % 50 }} {{ '%5.2f|%-4d|%03d' % (3.14159, 7, 5) }}",
     "1+2 1x 'x' 1 a and 'b' 50%  3.14|7   |005"},
    {"dict_methods",
     "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.items()|list }} {{ d.keys()|list }} {{ d.values()|list }} {{ msgs[0].get('role') }}",
     "1 None 5 [('a', 1), ('b', [1, 2])] ['a', 'b'] [1, [1, 2]] system"},
    {"list_methods",
     "{{ xs.count(2) }} {{ xs.index(3) }}",
     "1 2"},
    {"globals",
     "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1) }} {{ namespace(x=1).x }}",
     "[0, 1, 2] [1, 3, 5] [5, 3, 1] {'a': 1} 1"},
    {"dict_literals",
     "{{ {'a': {'b': 1}} }} {{ {'a': {'b': 1}}.a.b }} {{ {1: 'x'}[1] }} {{ {1: 'x'}[1.0] }} {{ {'k': 'v'}['k'] }}",
     "{'a': {'b': 1}} 1 x x v"},
    {"whitespace_dash_strips_unicode_space",
     "a\u00a0{{- ' b ' -}}\u00a0 c",
     "a b c"},
    {"deferred_unknown_filter_in_if",
     "{% if false %}{{ 1|nosuch }}{% endif %}{{ 1|nosuch if false else 2 }}ok",
     "2ok"},
    {"items_filter_in_tool_loop",
     "{% set tool = {'name': 'f', 'return': 'x', 'description': 'd'} %}{% for key, val in tool.items() if key != 'return' %}{{ key }}={{ val }}{% if not loop.last %}, {% endif %}{% endfor %}",
     "name=f, description=d"},
    {"loop_index_slicing",
     "{% for m in msgs %}{% for n in msgs[loop.index0 + 1:] %}{% if n.role == 'assistant' %}{% break %}{% endif %}{{ n.role }};{% endfor %}|{% endfor %}",
     "user;|||"},
};

class JinjaRender : public testing::TestWithParam<RenderCase> {};

TEST_P(JinjaRender, MatchesJinja2) {
  const RenderCase& c = GetParam();
  EXPECT_EQ(render(c.source), c.expected) << "template: " << c.source;
}

INSTANTIATE_TEST_SUITE_P(Features, JinjaRender, testing::ValuesIn(kRenderCases),
                         [](const testing::TestParamInfo<RenderCase>& info) {
                           return std::string(info.param.name);
                         });

// What a template error says: "[chat_template] line N: reason".
struct ErrorCase {
  const char* name;
  const char* source;
  int line;
  const char* reason;
};

const ErrorCase kErrorCases[] = {
    // Found while parsing.
    {"unknown_filter", "hello\n{{ name|shout }}", 2, "unknown filter 'shout'"},
    {"unknown_test", "a\n\n{% if x is loud %}{% endif %}", 3, "unknown test 'loud'"},
    {"unknown_filter_in_loop_inside_if", "{% if false %}\n{% for x in xs %}{{ x|nosuch }}{% endfor %}{% endif %}",
     2, "unknown filter 'nosuch'"},
    {"unknown_tag", "a\nb\n{% frobnicate %}", 3, "unknown tag 'frobnicate'"},
    {"unclosed_block", "{% for x in xs %}\nbody\n", 2,
     "unexpected end of template: 'for' block opened on line 1 was never closed (expected 'endfor')"},
    {"mismatched_end_tag", "{% if x %}\n{% endfor %}", 2, "unknown tag 'endfor' (expected 'endif')"},
    {"missing_operand", "x\n{{ 1 + }}", 2, "expected an expression, got end of print statement '}}'"},
    {"unterminated_string", "\n\n{% set x = 'abc %}", 3, "unterminated string literal"},
    {"unterminated_comment", "ok\n{# never closed", 2, "missing end of comment tag"},
    {"unterminated_tag", "{{ x", 1, "unexpected end of template, expected '}}'"},
    {"unbalanced_bracket", "x\n{{ [1, 2 }}", 2, "unexpected '}'"},
    {"break_outside_loop", "{% if true %}\n{% break %}{% endif %}", 2, "'break' outside of a loop"},
    {"bad_escape", "{{ '\\xZZ' }}", 1, "truncated \\x escape in string literal"},
    // Found while rendering.
    {"raise_exception", "{% if xs|length > 2 %}\n  {{ raise_exception('too many: ' ~ xs|length) }}\n{% endif %}", 2,
     "too many: 3"},
    {"attribute_of_undefined", "1\n2\n{{ missing.attr }}", 3, "'missing' is undefined"},
    {"attribute_of_missing_key", "{{ d.nope.deeper }}", 1, "'dict object' has no attribute 'nope'"},
    {"concatenate_str_and_int", "{% for x in xs %}\n{{ 'n=' + x }}\n{% endfor %}", 2,
     "can only concatenate str (not \"int\") to str"},
    {"in_none", "{{ 'a' in n }}", 1, "argument of type 'NoneType' is not iterable"},
    {"iterate_none", "{% for x in n %}{% endfor %}", 1, "'NoneType' object is not iterable"},
    {"slice_none", "{{ n[1:] }}", 1, "'NoneType' object is not subscriptable"},
    {"call_undefined", "{{ nothing() }}", 1, "'nothing' is undefined"},
    {"call_string", "{{ s() }}", 1, "'str' object is not callable"},
    {"division_by_zero", "{{ 1 / 0 }}", 1, "division by zero"},
    {"unpack_non_sequence", "{% for a, b in xs %}{% endfor %}", 1, "cannot unpack non-iterable int object"},
    {"unpack_wrong_length", "{% set a, b = [1, 2, 3] %}", 1, "too many values to unpack (expected 2)"},
    {"set_attribute_on_non_namespace", "{% set d.x = 1 %}", 1, "cannot assign attribute on non-namespace object"},
    {"unsafe_list_append", "{% set l = [] %}\n{{ l.append(1) }}", 2, "access to attribute 'append' of 'list' object is unsafe"},
    {"tojson_of_undefined", "{{ missing|tojson }}", 1, "Object of type Undefined is not JSON serializable"},
    {"unknown_filter_in_taken_if", "{% if true %}\n{{ 1|nosuch }}\n{% endif %}", 2, "unknown filter 'nosuch'"},
    {"error_inside_macro_names_macro_line", "{% macro f(x) %}\n{{ x.a.b }}\n{% endmacro %}\n{{ f({}) }}", 2,
     "'dict object' has no attribute 'a'"},
    {"macro_too_many_arguments", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", 1,
     "macro 'f' takes not more than 1 argument(s)"},
    {"macro_recursion", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", 1,
     "maximum recursion depth exceeded in macro 'f'"},
    {"range_too_big", "{{ range(1000000)|length }}", 1,
     "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"huge_repetition", "{{ 'x' * 1000000000 }}", 1, "string repetition too large"},
    {"filter_bad_keyword", "{{ xs|join(sep=',') }}", 1, "join() got an unexpected keyword argument 'sep'"},
};

class JinjaError : public testing::TestWithParam<ErrorCase> {};

TEST_P(JinjaError, NamesTheLine) {
  const ErrorCase& c = GetParam();
  try {
    render(c.source);
    FAIL() << "expected a TemplateError for: " << c.source;
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.line(), c.line) << e.what();
    EXPECT_EQ(e.reason(), c.reason) << e.what();
    EXPECT_EQ(std::string(e.what()),
              "[chat_template] line " + std::to_string(c.line) + ": " + c.reason);
    EXPECT_EQ(e.template_name(), "chat_template");
  }
}

INSTANTIATE_TEST_SUITE_P(Errors, JinjaError, testing::ValuesIn(kErrorCases),
                         [](const testing::TestParamInfo<ErrorCase>& info) {
                           return std::string(info.param.name);
                         });

TEST(Jinja, TemplateErrorIsAnAugurError) {
  EXPECT_THROW(jinja::Template("{{ x|nope }}"), Error);
}

TEST(Jinja, ContextMustBeAnObject) {
  const jinja::Template t("x");
  EXPECT_THROW(t.render(nlohmann::ordered_json::array()), TemplateError);
}

TEST(Jinja, RendersRepeatedlyWithoutKeepingState) {
  const jinja::Template t(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  EXPECT_EQ(t.render({{"messages", {1, 2, 3}}}), "3");
  EXPECT_EQ(t.render({{"messages", {1}}}), "1");
  EXPECT_EQ(t.render(nlohmann::ordered_json::object()), "0");
}

TEST(Jinja, ObjectKeyOrderIsKeptByTojson) {
  // Python dicts keep insertion order and transformers' tojson does not sort.
  const auto ctx = nlohmann::ordered_json::parse(R"({"tool": {"z": 1, "a": {"y": 2, "b": 3}}})");
  EXPECT_EQ(render("{{ tool|tojson }}", ctx), R"({"z": 1, "a": {"y": 2, "b": 3}})");
}

TEST(Jinja, StrftimeNowUsesTheLocalClock) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  EXPECT_EQ(render("{{ strftime_now('%Y') }}"), std::to_string(1900 + tm.tm_year));
}

TEST(Jinja, SelfContainingNamespaceIsAnErrorNotACrash) {
  EXPECT_THROW(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), TemplateError);
}

TEST(Jinja, DeepNestingIsAnErrorNotACrash) {
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  try {
    render(deep);
    FAIL() << "expected an error";
  } catch (const TemplateError& e) {
    EXPECT_EQ(e.reason(), "template nested too deeply");
  }
}

TEST(Jinja, InvalidUtf8PassesThroughUnchanged) {
  const auto ctx = nlohmann::ordered_json{{"s", "ok"}};
  EXPECT_EQ(render("a\xff\xfe{{ s }}", ctx), "a\xff\xfeok");
  EXPECT_EQ(render("{{ 'x\xffy'|length }} {{ 'x\xffy'[1:]|upper }}", ctx), "3 \xffY");
}

}  // namespace
}  // namespace augur
