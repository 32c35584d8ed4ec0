// The Jinja interpreter feature by feature, with exact expected output as jinja2 (Python)
// renders it under transformers' settings (trim_blocks, lstrip_blocks), plus malformed and
// truncated templates, which must come back as errors with a line and column, never crash.
#include <ctime>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "engine/tokenizer/jinja/template.h"
#include "gtest/gtest.h"

namespace morserve::jinja {
namespace {

absl::StatusOr<std::string> Try(std::string_view tpl, std::string_view context = "{}",
                                const RenderOptions& options = {}) {
  absl::StatusOr<Template> t = Template::Parse(tpl);
  if (!t.ok()) return t.status();
  return t->Render(nlohmann::ordered_json::parse(context), options);
}

std::string R(std::string_view tpl, std::string_view context = "{}") {
  absl::StatusOr<std::string> r = Try(tpl, context);
  EXPECT_TRUE(r.ok()) << tpl << " -> " << r.status();
  return r.ok() ? *r : "<error>";
}

// ---------------------------------------------------------------- text and whitespace

TEST(JinjaText, PlainTextAndOneTrailingNewlineRemoved) {
  EXPECT_EQ(R("hello"), "hello");
  EXPECT_EQ(R("hello\n"), "hello");
  EXPECT_EQ(R("a\n\n"), "a\n");
  EXPECT_EQ(R("a\r\nb"), "a\nb");
  EXPECT_EQ(R(""), "");
}

TEST(JinjaText, CommentsVanish) {
  EXPECT_EQ(R("a{# note #}b"), "ab");
  EXPECT_EQ(R("a {#- note -#} b"), "ab");
  EXPECT_EQ(R("{# note #}\nb"), "b");  // trim_blocks applies to comments
}

TEST(JinjaText, DashStripsWhitespaceOnThatSide) {
  EXPECT_EQ(R("a  \n {{- 'x' -}} \n  b"), "axb");
  EXPECT_EQ(R("a  {{ 'x' -}}  b"), "a  xb");
  EXPECT_EQ(R("a \n{%- if true %} b{% endif %}"), "a b");
  EXPECT_EQ(R("{% if true -%}\n\n  b  {%- endif %}"), "b");
}

TEST(JinjaText, TrimBlocksDropsOneNewlineAfterBlockTags) {
  EXPECT_EQ(R("{% if true %}\nyes\n{% endif %}\n"), "yes\n");
  EXPECT_EQ(R("{% if true %}\n\nyes{% endif %}"), "\nyes");
  EXPECT_EQ(R("{{ 'x' }}\ny"), "x\ny");  // not after expressions
}

TEST(JinjaText, LstripBlocksDropsIndentBeforeBlockTags) {
  EXPECT_EQ(R("a\n    {% if true %}\n    b\n    {% endif %}\nc"), "a\n    b\nc");
  EXPECT_EQ(R("  {% if true %}x{% endif %}"), "x");
  EXPECT_EQ(R("  {{ 'x' }}"), "  x");                    // not before expressions
  EXPECT_EQ(R("a  {% if true %}x{% endif %}"), "a  x");  // only at line start
  EXPECT_EQ(R("  {%+ if true %}x{% endif %}"), "  x");   // + keeps it
}

TEST(JinjaText, RawBlockIsLiteral) {
  EXPECT_EQ(R("{% raw %}{{ not parsed }}{% endraw %}"), "{{ not parsed }}");
}

// ---------------------------------------------------------------- expressions

TEST(JinjaExpr, Arithmetic) {
  EXPECT_EQ(R("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 2 ** 10 }}|{{ 2 ** 3 ** 2 }}"), "7|9|1024|64");
  EXPECT_EQ(R("{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}"), "3|-4|1|2");
  EXPECT_EQ(R("{{ 7 / 2 }}|{{ 4 / 2 }}|{{ 1.5 + 1 }}|{{ -3 }}|{{ - 2.5 }}"), "3.5|2.0|2.5|-3|-2.5");
  EXPECT_EQ(R("{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ [1] + [2] }}"), "ababab|[1, 1]|[1, 2]");
}

TEST(JinjaExpr, FloatsPrintLikePython) {
  EXPECT_EQ(R("{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1e-5 }}|{{ 0.0001 }}|{{ 1e16 }}|{{ 1e15 }}"),
            "1.0|0.30000000000000004|1e+20|1e-05|0.0001|1e+16|1000000000000000.0");
}

TEST(JinjaExpr, ConcatenationAndStrings) {
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ none ~ true ~ missing }}"), "a1NoneTrue");
  EXPECT_EQ(R("{{ 'a' + 'b' }}|{{ 'a' 'b' }}"), "ab|ab");
  EXPECT_EQ(R(R"({{ 'a\nb\t\'q\'' }})"), "a\nb\t'q'");
  EXPECT_EQ(R(R"({{ "\u00e9\x41\\" }})"),
            "\xC3\xA9"
            "A\\");
  EXPECT_EQ(R(R"({{ 'x\d' }})"), "x\\d");  // unknown escapes keep the backslash
}

TEST(JinjaExpr, ComparisonsAndLogic) {
  EXPECT_EQ(R("{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ 'a' < 'b' }}"),
            "TrueFalseTrueTrueTrue");
  EXPECT_EQ(R("{{ 0 or 'x' }}|{{ 1 and 2 }}|{{ not 1 }}|{{ none and 1 }}|{{ [] or {} }}"),
            "x|2|False|None|{}");
  EXPECT_EQ(R("{{ not 1 == 2 }}|{{ true == 1 }}|{{ none == none }}"), "True|True|True");
}

TEST(JinjaExpr, Membership) {
  EXPECT_EQ(R("{{ 'b' in 'abc' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}"
              "{{ 'z' in missing }}"),
            "TrueTrueTrueTrueFalse");
}

TEST(JinjaExpr, ConditionalExpression) {
  EXPECT_EQ(R("{{ 'y' if true else 'n' }}|{{ 'y' if false }}|{{ 1 if 0 else 2 if 0 else 3 }}"),
            "y||3");
}

TEST(JinjaExpr, LiteralsPrintAsPythonReprs) {
  EXPECT_EQ(R("{{ [1, 'a', none, true, 1.5] }}"), "[1, 'a', None, True, 1.5]");
  EXPECT_EQ(R("{{ {'a': 1, 'b': [False]} }}|{{ (1,) }}|{{ (1, 2) }}|{{ () }}"),
            "{'a': 1, 'b': [False]}|(1,)|(1, 2)|()");
  EXPECT_EQ(R("{{ True }}{{ None }}{{ false }}|{{ [\"it's\"] }}"), "TrueNoneFalse|[\"it's\"]");
}

TEST(JinjaExpr, SubscriptsAndSlices) {
  const char* ctx = R"({"xs": [1, 2, 3], "s": "h\u00e9llo"})";
  EXPECT_EQ(R("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}", ctx),
            "13[2, 3][1, 2][3, 2, 1][1, 3]");
  EXPECT_EQ(R("{{ s[1] }}|{{ s[1:3] }}|{{ s[::-1] }}|{{ xs[7] }}|{{ xs.0 }}", ctx),
            "\xC3\xA9|\xC3\xA9l|oll\xC3\xA9h||1");
}

TEST(JinjaExpr, AttributeAndItemAccessOnDicts) {
  const char* ctx = R"({"m": {"role": "user", "items": "shadowed"}, "d": {}})";
  EXPECT_EQ(R("{{ m.role }}{{ m['role'] }}{{ d.nokey }}{{ m['items'] }}", ctx),
            "useruser"
            "shadowed");
  // `.items` is the dict method first, as in Python.
  EXPECT_EQ(R("{{ m.items()|list|length }}", ctx), "2");
}

TEST(JinjaExpr, UndefinedIsEmptyUntilUsed) {
  EXPECT_EQ(R("[{{ missing }}]{{ missing is defined }}{{ missing|length }}"), "[]False0");
  absl::StatusOr<std::string> r = Try("{{ d.nokey.deeper }}", R"({"d": {}})");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("'dict object' has no attribute 'nokey'"), std::string::npos)
      << r.status();
  EXPECT_FALSE(Try("{{ missing + 1 }}").ok());
  EXPECT_FALSE(Try("{{ missing() }}").ok());
}

TEST(JinjaExpr, TypeErrorsAreErrorsNotGuesses) {
  absl::StatusOr<std::string> r = Try("{{ 'a' + 1 }}");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("can only concatenate str (not \"int\") to str"),
            std::string::npos)
      << r.status();
  EXPECT_FALSE(Try("{{ 1 / 0 }}").ok());
  EXPECT_FALSE(Try("{{ 'a' < 1 }}").ok());
  EXPECT_FALSE(Try("{{ 5() }}").ok());
}

// ---------------------------------------------------------------- statements

TEST(JinjaStmt, IfElifElse) {
  const char* tpl =
      "{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three{% else %}many{% endif %}";
  EXPECT_EQ(R(tpl, R"({"x": 1})"), "one");
  EXPECT_EQ(R(tpl, R"({"x": 3})"), "three");
  EXPECT_EQ(R(tpl, R"({"x": 9})"), "many");
}

TEST(JinjaStmt, ForLoopVariables) {
  EXPECT_EQ(
      R("{% for x in ['a', 'b'] %}{{ x }}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
        "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }}|{% endfor %}"),
      "a10TrueFalse221|b21FalseTrue210|");
  EXPECT_EQ(R("{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}"
              "{{ loop.cycle('a', 'b') }} {% endfor %}"),
            "-2a 1-3b 2-a ");
}

TEST(JinjaStmt, ForElseFilterUnpackAndIterables) {
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in missing %}x{% else %}none{% endfor %}"), "none");
  EXPECT_EQ(R("{% for x in [1, 2, 3] if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}"), "2132");
  const char* ctx = R"({"d": {"b": 1, "a": 2}})";
  EXPECT_EQ(R("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", ctx), "b=1;a=2;");
  EXPECT_EQ(R("{% for k in d %}{{ k }}{% endfor %}|{% for c in 'ab' %}{{ c }}.{% endfor %}", ctx),
            "ba|a.b.");
  EXPECT_EQ(R("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}"), "37");
  EXPECT_FALSE(Try("{% for a, b in [[1, 2, 3]] %}{% endfor %}").ok());
  EXPECT_FALSE(Try("{% for x in 5 %}{% endfor %}").ok());
}

TEST(JinjaStmt, BreakAndContinue) {
  EXPECT_EQ(R("{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}"
              "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "13");
}

TEST(JinjaStmt, SetScopingMatchesJinja) {
  EXPECT_EQ(R("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}"), "21");
  EXPECT_EQ(R("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}"), "2");
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(R("{% set x %}hi {{ 1 }}{% endset %}[{{ x }}]"), "[hi 1]");
}

TEST(JinjaStmt, NamespaceCarriesStateOutOfLoops) {
  EXPECT_EQ(
      R("{% set ns = namespace(n=0, seen=false) %}{% for i in [1, 2, 3] %}"
        "{% set ns.n = ns.n + i %}{% set ns.seen = true %}{% endfor %}{{ ns.n }}{{ ns.seen }}"),
      "6True");
  EXPECT_EQ(R("{% set ns = namespace({'a': 1}) %}{{ ns.a }}{{ ns['a'] }}{{ ns.b is defined }}"),
            "11False");
  EXPECT_FALSE(Try("{% set d = {} %}{% set d.x = 1 %}").ok());
}

TEST(JinjaStmt, Macros) {
  EXPECT_EQ(R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
              "{{ greet('Bob') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}"),
            "Hi Bob! Hi Al? Hi Cy!");
  EXPECT_EQ(R("{% set g = 'G' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}"), "G");
  EXPECT_FALSE(Try("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").ok());
  // Unbounded recursion is an error, not a stack overflow.
  EXPECT_FALSE(Try("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}").ok());
}

TEST(JinjaStmt, GenerationBlockRendersInPlace) {
  EXPECT_EQ(R("a{% generation %}b{% endgeneration %}c"), "abc");
}

// ---------------------------------------------------------------- filters

TEST(JinjaFilter, StringFilters) {
  EXPECT_EQ(R("[{{ '  x y \n'|trim }}]{{ 'xxhixx'|trim('x') }}"), "[x y]hi");
  EXPECT_EQ(R("{{ 'aBc'|upper }}{{ 'aBc'|lower }}{{ 'hELLO wORLD'|capitalize }}"),
            "ABCabcHello world");
  EXPECT_EQ(R("{{ 'hello wORLD-x (y'|title }}"), "Hello World-X (Y");
  EXPECT_EQ(R("{{ 'aaa'|replace('a', 'b') }}{{ 'aaa'|replace('a', 'b', 2) }}"), "bbbbba");
  EXPECT_EQ(R("{{ '<a href=\"x\">&'|e }}|{{ 'x'|safe }}"), "&lt;a href=&#34;x&#34;&gt;&amp;|x");
  EXPECT_EQ(R("{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"),
            "a\n  b\n\n  c|  a\n  b");
  EXPECT_EQ(R("{{ 'one two  three'|wordcount }}"), "3");
}

TEST(JinjaFilter, SequenceFilters) {
  EXPECT_EQ(R("{{ [1, 2]|join(', ') }}|{{ ['a', 'b']|join }}|{{ 'abc'|list }}"),
            "1, 2|ab|['a', 'b', 'c']");
  EXPECT_EQ(R("{{ [3, 1, 2]|first }}{{ [3, 1, 2]|last }}{{ []|first is defined }}"), "32False");
  EXPECT_EQ(R("{{ 'h\u00e9'|length }}{{ [1, 2]|length }}{{ {'a': 1}|length }}{{ [1]|count }}"),
            "2211");
  EXPECT_EQ(R("{{ [3, 1, 2]|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ ['b', 'A', 'c']|sort }}"),
            "[1, 2, 3][3, 2, 1]['A', 'b', 'c']");
  EXPECT_EQ(R("{{ [1, 2]|reverse|list }}{{ 'ab'|reverse }}{{ [1, 2, 1]|unique|list }}"),
            "[2, 1]ba[1, 2]");
  EXPECT_EQ(R("{{ {'a': 1}|items|list }}{{ {'b': 2, 'a': 1}|dictsort }}"),
            "[('a', 1)][('a', 1), ('b', 2)]");
  EXPECT_EQ(R("{{ [1, 2, 3]|sum }}{{ [1, 5, 3]|max }}{{ [4, 2]|min }}"), "652");
}

TEST(JinjaFilter, AttributeFilters) {
  const char* ctx =
      R"({"ms": [{"role": "system", "n": 1}, {"role": "user", "n": 2, "tool": {"id": 7}},
                               {"role": "user"}]})";
  EXPECT_EQ(R("{{ ms|selectattr('role', 'equalto', 'user')|list|length }}", ctx), "2");
  EXPECT_EQ(R("{{ ms|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }}", ctx),
            "['system']");
  EXPECT_EQ(R("{{ ms|selectattr('n')|map(attribute='n')|list }}", ctx), "[1, 2]");
  EXPECT_EQ(R("{{ ms|selectattr('n', 'defined')|list|length }}", ctx), "2");
  EXPECT_EQ(R("{{ ms|map(attribute='n', default=0)|list }}", ctx), "[1, 2, 0]");
  EXPECT_EQ(R("{{ ms[1:2]|map(attribute='tool.id')|list }}", ctx), "[7]");
  // As in jinja2, a missing intermediate attribute is an error even with a default.
  EXPECT_FALSE(Try("{{ ms|map(attribute='tool.id', default=0)|list }}", ctx).ok());
  EXPECT_EQ(R("{{ ['a', 'b']|map('upper')|join }}{{ [1, 2, 3]|select('odd')|list }}"
              "{{ [1, 2, 3]|reject('odd')|list }}"),
            "AB[1, 3][2]");
  EXPECT_EQ(R("{{ ms|map(attribute='role')|join(',') }}", ctx), "system,user,user");
}

TEST(JinjaFilter, DefaultAndConversions) {
  EXPECT_EQ(R("{{ missing|default('d') }}{{ ''|default('d', true) }}{{ none|default('d') }}{{ "
              "missing|d }}"),
            "ddNone");
  EXPECT_EQ(
      R("{{ '42'|int }}{{ '3.7'|int }}{{ 'x'|int }}{{ 'x'|int(5) }}{{ 3.9|int }}{{ true|int }}"),
      "4230531");
  EXPECT_EQ(R("{{ '2.5'|float }}{{ 2|float }}{{ 1|string ~ 'x' }}{{ [1]|string }}{{ -3|abs }}"),
            "2.52.01x[1]3");
  EXPECT_EQ(R("{{ 2.567|round(2) }}{{ 2.5|round }}{{ 2.1|round(method='ceil') }}"), "2.573.03.0");
}

TEST(JinjaFilter, ToJsonMatchesPythonJsonDumps) {
  const char* ctx = R"({"d": {"b": [1, "\u00e9\n", null, true, 2.0], "a": "x\"y"}})";
  EXPECT_EQ(R("{{ d|tojson }}", ctx),
            "{\"b\": [1, \"\xC3\xA9\\n\", null, true, 2.0], \"a\": \"x\\\"y\"}");
  EXPECT_EQ(R("{{ d|tojson(indent=2) }}", ctx),
            "{\n  \"b\": [\n    1,\n    \"\xC3\xA9\\n\",\n    null,\n    true,\n    2.0\n  ],\n"
            "  \"a\": \"x\\\"y\"\n}");
  EXPECT_EQ(R("{{ d|tojson(sort_keys=true, separators=(',', ':')) }}", ctx),
            "{\"a\":\"x\\\"y\",\"b\":[1,\"\xC3\xA9\\n\",null,true,2.0]}");
  EXPECT_EQ(
      R("{{ d.b[1]|tojson(ensure_ascii=true) }}{{ '\U0001F600'|tojson(ensure_ascii=true) }}", ctx),
      "\"\\u00e9\\n\"\"\\ud83d\\ude00\"");
  EXPECT_EQ(R("{{ []|tojson(indent=2) }}{{ {}|tojson }}{{ 'a<b'|tojson }}"), "[]{}\"a<b\"");
  EXPECT_FALSE(Try("{{ missing|tojson }}").ok());
}

// ---------------------------------------------------------------- tests

TEST(JinjaTest, BuiltinTests) {
  const char* ctx =
      R"({"s": "x", "n": 1, "f": 1.5, "b": true, "l": [1], "d": {"k": 1}, "z": null})";
  EXPECT_EQ(
      R("{{ s is string }}{{ n is string }}{{ d is mapping }}{{ l is mapping }}{{ l is iterable }}"
        "{{ s is iterable }}{{ n is iterable }}{{ missing is iterable }}",
        ctx),
      "TrueFalseTrueFalseTrueTrueFalseTrue");
  EXPECT_EQ(
      R("{{ n is number }}{{ f is number }}{{ b is number }}{{ n is integer }}{{ b is integer }}"
        "{{ f is float }}{{ b is boolean }}{{ b is true }}{{ b is false }}{{ z is none }}",
        ctx),
      "TrueTrueTrueTrueFalseTrueTrueTrueFalseTrue");
  EXPECT_EQ(R("{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}"
              "{{ s is sequence }}{{ n is sequence }}{{ range is callable }}{{ s is callable }}",
              ctx),
            "TrueTrueTrueFalseTrueFalseTrueFalse");
  EXPECT_EQ(
      R("{{ n is eq 1 }}{{ n is equalto(2) }}{{ 1 is in [1] }}{{ 'x' is lower }}{{ z is not none }}"
        "{{ missing is undefined }}{{ n is gt 0 }}",
        ctx),
      "TrueFalseTrueTrueFalseTrueTrue");
}

// ---------------------------------------------------------------- methods and globals

TEST(JinjaMethods, StringMethods) {
  EXPECT_EQ(R("[{{ '  a  '.strip() }}|{{ '\n\na b\n'.strip('\n') }}|{{ 'xxaxx'.lstrip('x') }}|"
              "{{ 'xxaxx'.rstrip('x') }}|{{ '  a'.lstrip() }}]"),
            "[a|a b|axx|xxa|a]");
  EXPECT_EQ(R("{{ 'a b  c'.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}"
              "{{ 'a b c'.split(none, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}"),
            "['a', 'b', 'c']['a', 'b', '', 'c']['a', 'b,c']['a', 'b c']['a,b', 'c']");
  EXPECT_EQ(R("{{ 'hello'.startswith('he') }}{{ 'hello'.startswith(('x', 'h')) }}{{ "
              "'hello'.endswith('lo') }}"
              "{{ 'hello'.endswith('x') }}"),
            "TrueTrueTrueFalse");
  EXPECT_EQ(R("{{ 'aXa'.replace('a', 'b') }}{{ 'aaa'.replace('a', '', 1) }}{{ 'ab'.upper() }}{{ "
              "'AB'.lower() }}"
              "{{ \"they're bill's\".title() }}{{ 'hi there'.capitalize() }}"),
            "bXbaaABab"
            "They'Re Bill'SHi there");
  EXPECT_EQ(
      R("{{ 'h\u00e9llo'.find('l') }}{{ 'hello'.find('z') }}{{ 'hello'.count('l') }}"
        "{{ ', '.join(['a', 'b']) }}{{ '{} and {name}'.format(1, name='x') }}{{ '12'.isdigit() }}"),
      "2-12a, b1 and xTrue");
  EXPECT_EQ(R("{{ '</think>' in 'a</think>b' }}{{ "
              "'a</think>\n\nb'.split('</think>')[-1].lstrip('\n') }}"),
            "Trueb");
}

TEST(JinjaMethods, DictMethods) {
  const char* ctx = R"({"d": {"a": 1, "b": 2}})";
  EXPECT_EQ(R("{{ d.keys()|list }}{{ d.values()|list }}{{ d.items()|list }}", ctx),
            "['a', 'b'][1, 2][('a', 1), ('b', 2)]");
  EXPECT_EQ(R("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 9) }}", ctx), "1None9");
  EXPECT_FALSE(Try("{{ d.update({}) }}", ctx).ok());  // no mutating methods
}

TEST(JinjaGlobals, RangeDictAndNamespace) {
  EXPECT_EQ(R("{{ range(3)|list }}{{ range(1, 10, 3)|list }}{{ range(3, 0, -1)|list }}"),
            "[0, 1, 2][1, 4, 7][3, 2, 1]");
  EXPECT_EQ(R("{{ dict(a=1, b='x') }}"), "{'a': 1, 'b': 'x'}");
  EXPECT_FALSE(Try("{{ range(100000000)|length }}").ok());
}

TEST(JinjaGlobals, RaiseExceptionIsAClearError) {
  absl::StatusOr<std::string> r =
      Try("line one\n{% if true %}   {{ raise_exception('Bad roles!') }}{% endif %}");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(r.status().message()),
            "template raised an exception at line 2, column 20: Bad roles!");
}

TEST(JinjaGlobals, StrftimeNowUsesTheInjectedClock) {
  RenderOptions options;
  options.clock = [] {
    std::tm tm{};
    tm.tm_year = 2024 - 1900;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    tm.tm_hour = 9;
    tm.tm_min = 5;
    return tm;
  };
  absl::StatusOr<std::string> r =
      Try("Today Date: {{ strftime_now('%d %b %Y') }} {{ strftime_now('%H:%M') }}", "{}", options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "Today Date: 26 Jul 2024 09:05");
}

// ---------------------------------------------------------------- errors at load

void ExpectParseError(std::string_view tpl, absl::StatusCode code, std::string_view fragment) {
  absl::StatusOr<Template> t = Template::Parse(tpl);
  ASSERT_FALSE(t.ok()) << tpl;
  EXPECT_EQ(t.status().code(), code) << t.status();
  EXPECT_NE(std::string(t.status().message()).find(std::string(fragment)), std::string::npos)
      << t.status();
}

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  ExpectParseError("{% if x %}", absl::StatusCode::kInvalidArgument, "expected '{% endif %}'");
  ExpectParseError("a\nbc {{ 1 + }}", absl::StatusCode::kInvalidArgument, "line 2, column 11");
  ExpectParseError("{{ 'abc }}", absl::StatusCode::kInvalidArgument, "unterminated string");
  ExpectParseError("{# never closed", absl::StatusCode::kInvalidArgument, "unterminated comment");
  ExpectParseError("{{ x ]] }}", absl::StatusCode::kInvalidArgument, "unexpected ']'");
  ExpectParseError("{% endfor %}", absl::StatusCode::kInvalidArgument, "endfor");
  ExpectParseError("{{ a $ b }}", absl::StatusCode::kInvalidArgument, "unexpected character '$'");
  ExpectParseError("{% for %}{% endfor %}", absl::StatusCode::kInvalidArgument, "loop variable");
}

TEST(JinjaErrors, UnsupportedFeaturesAreUnimplemented) {
  ExpectParseError("{{ x|frobnicate }}", absl::StatusCode::kUnimplemented,
                   "unsupported filter 'frobnicate'");
  ExpectParseError("{{ x is prime }}", absl::StatusCode::kUnimplemented,
                   "unsupported test 'prime'");
  ExpectParseError("{% include 'other.j2' %}", absl::StatusCode::kUnimplemented, "include");
  ExpectParseError("{% for x in xs recursive %}{% endfor %}", absl::StatusCode::kUnimplemented,
                   "recursive");
  ExpectParseError("{{ f(*args) }}", absl::StatusCode::kUnimplemented, "unpacking");
}

TEST(JinjaErrors, DeepNestingIsAnErrorNotAStackOverflow) {
  EXPECT_FALSE(Template::Parse("{{ " + std::string(100000, '(') + " }}").ok());
  EXPECT_FALSE(Template::Parse("{{ " + std::string(100000, '-') + "1 }}").ok());
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  EXPECT_FALSE(Template::Parse(ifs).ok());
  EXPECT_FALSE(Try("{{ 'x' * 1000000000 }}").ok());
}

// Work without output is bounded too (RenderLimits::max_steps): nested loops over large
// ranges, loop filters, and a macro that calls itself twice per level (2^60 calls) fail fast
// with a clear error (here with a limit of 50,000 steps, to stay quick under sanitizers); the
// default limit (2,000,000) stops the nested loops and lets 100,000 iterations render.
TEST(JinjaErrors, RunawayLoopsAreAnErrorNotAHang) {
  const char* runaway[] = {
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
      "{% for a in range(100000) %}{% for b in range(100000) if b < 0 %}{% endfor %}{% endfor %}",
      "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
      "{{ f(60) }}",
  };
  RenderOptions small;
  small.max_steps = 50'000;
  for (const char* tpl : runaway) {
    absl::StatusOr<std::string> r = Try(tpl, "{}", small);
    ASSERT_FALSE(r.ok()) << tpl;
    EXPECT_NE(r.status().message().find("step limit"), std::string::npos) << r.status();
  }
  absl::StatusOr<std::string> r = Try(runaway[0]);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("step limit"), std::string::npos) << r.status();
  EXPECT_EQ(R("{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% set ns.n = ns.n + 1 "
              "%}{% endfor %}{{ ns.n }}"),
            "100000");
}

// A template close to the real ones (Llama 2 chat), to be cut and mangled below.
constexpr const char* kLlama2Chat =
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set "
    "system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = "
    "false %}"
    "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') "
    "}}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% "
    "endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% "
    "endif %}{% endfor %}";

constexpr const char* kChatContext =
    R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": " Hi "},
                     {"role": "assistant", "content": "Yo"}, {"role": "user", "content": "Q"}],
        "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true})";

TEST(JinjaErrors, Llama2ChatRendersAsInPython) {
  EXPECT_EQ(R(kLlama2Chat, kChatContext),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n Hi [/INST] Yo </s><s>[INST] Q [/INST]");
}

TEST(JinjaErrors, EveryTruncationIsAnErrorOrRenders) {
  const std::string full = kLlama2Chat;
  const auto context = nlohmann::ordered_json::parse(kChatContext);
  int parse_errors = 0;
  for (size_t n = 0; n < full.size(); ++n) {
    absl::StatusOr<Template> t = Template::Parse(full.substr(0, n));
    if (!t.ok()) {
      ++parse_errors;
      EXPECT_FALSE(t.status().message().empty());
      continue;
    }
    (void)t->Render(context);  // may fail (e.g. undefined names), must not crash
  }
  EXPECT_GT(parse_errors, static_cast<int>(full.size()) / 2);
}

TEST(JinjaErrors, RandomMutationsNeverCrash) {
  const std::string full = kLlama2Chat;
  const auto context = nlohmann::ordered_json::parse(kChatContext);
  std::mt19937 rng(1234);
  const std::string alphabet = "{}%#-+()[]'\".,:|~*/ abcxyz0123456789\n\\";
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = full;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s.erase(at, 1 + rng() % 8);
          break;
        case 1:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          s[at] = alphabet[rng() % alphabet.size()];
      }
      if (s.empty()) s = "x";
    }
    absl::StatusOr<Template> t = Template::Parse(s);
    if (t.ok()) (void)t->Render(context);
  }
}

}  // namespace
}  // namespace morserve::jinja
