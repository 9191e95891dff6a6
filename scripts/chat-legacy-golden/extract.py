import json, re, sys
src = open('/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/tests/test-chat-template.cpp', encoding='utf-8').read()
start = src.index('std::vector<TestCase> test_cases {')
i = start + len('std::vector<TestCase> test_cases ')
# tokenizer
def tokens(s, i):
    n = len(s)
    while i < n:
        c = s[i]
        if c.isspace(): i += 1; continue
        if s.startswith('//', i):
            i = s.index('\n', i); continue
        if s.startswith('/*', i):
            i = s.index('*/', i) + 2; continue
        if s.startswith('u8"', i):
            i += 2; continue
        if c == '"':
            j = i + 1; out = []
            while s[j] != '"':
                if s[j] == '\\':
                    e = s[j+1]
                    m = {'n':'\n','t':'\t','\\':'\\','"':'"',"'":"'",'r':'\r','0':'\0'}
                    if e not in m: raise Exception('escape ' + e)
                    out.append(m[e]); j += 2
                else:
                    if s[j] == '\n': raise Exception('newline in literal')
                    out.append(s[j]); j += 1
            yield ('str', ''.join(out)); i = j + 1; continue
        if c in '{},()': yield (c, c); i += 1; continue
        m = re.match(r'[A-Za-z_][A-Za-z0-9_]*', s[i:])
        if m: yield ('id', m.group(0)); i += len(m.group(0)); continue
        if c == ';': yield (';', ';'); return
        raise Exception('unexpected %r at %d' % (c, i))
toks = list(tokens(src, i))
# parse nested braces into lists; strings adjacent are concatenated; U8C(x) -> x
pos = 0
def parse():
    global pos
    t = toks[pos]
    if t[0] == '{':
        pos += 1; items = []
        while toks[pos][0] != '}':
            items.append(parse())
            if toks[pos][0] == ',': pos += 1
        pos += 1
        return items
    if t[0] == 'str':
        s = ''
        while toks[pos][0] == 'str': s += toks[pos][1]; pos += 1
        return s
    if t == ('id', 'U8C'):
        assert toks[pos+1][0] == '('; pos += 2
        v = parse(); assert toks[pos][0] == ')'; pos += 1
        return v
    if t[0] == 'id':
        pos += 1
        return {'true': True, 'false': False}[t[1]]
    raise Exception(t)
cases = parse()
fields = ['name','template','expected','expected_jinja','bos_token','eos_token','supported_with_jinja','extra_conversation']
out = []
for c in cases:
    d = dict(zip(fields, c))
    e = {'name': d['name'], 'template': d['template'], 'expected': d['expected']}
    if d.get('extra_conversation'):
        e['extra_conversation'] = [list(m) for m in d['extra_conversation']]
    out.append(e)
print(len(out), file=sys.stderr)
for e in out: print(e['name'], file=sys.stderr)
json.dump(out, open('/tmp/chatlegacy/cases.json','w'), ensure_ascii=False, indent=1)
