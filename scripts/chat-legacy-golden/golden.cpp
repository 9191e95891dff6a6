// Golden generator: links llama.cpp's src/llama-chat.cpp unchanged and dumps
// llm_chat_detect_template / llm_chat_apply_template results as JSON.
#include "llama-chat.h"
#include "llama.h"
#include <cstdio>
#include <map>
#include <string>
#include <vector>

static std::string js(const std::string & s) {
    std::string o = "\"";
    for (unsigned char c : s) {
        if (c == '"') o += "\\\"";
        else if (c == '\\') o += "\\\\";
        else if (c < 0x20) { char b[8]; snprintf(b, sizeof b, "\\u%04x", c); o += b; }
        else o += (char) c;
    }
    return o + "\"";
}

static const char * NAMES[] = {
    "chatml","llama2","llama2-sys","llama2-sys-bos","llama2-sys-strip","mistral-v1","mistral-v3",
    "mistral-v3-tekken","mistral-v7","mistral-v7-tekken","phi3","phi4","falcon3","zephyr","monarch",
    "gemma","orion","openchat","vicuna","vicuna-orca","deepseek","deepseek2","deepseek3","deepseek-ocr",
    "command-r","llama3","chatglm3","chatglm4","glmedge","minicpm","exaone3","exaone4","exaone-moe",
    "rwkv-world","granite","granite-4.0","granite-4.1","gigachat","megrez","yandex","bailing",
    "bailing-think","bailing2","llama4","smolvlm","dots1","hunyuan-moe","gpt-oss","hunyuan-dense",
    "hunyuan-vl","kimi-k2","seed_oss","grok-2","pangu-embedded","solar-open","unknown",
};

int main() {
    static_assert(sizeof(NAMES) / sizeof(NAMES[0]) == LLM_CHAT_TEMPLATE_UNKNOWN + 1, "names");
    for (int t = 0; t < LLM_CHAT_TEMPLATE_UNKNOWN; t++) {
        if (t == LLM_CHAT_TEMPLATE_DOTS1) continue;
        if (llm_chat_template_from_str(NAMES[t]) != t) { fprintf(stderr, "name %s\n", NAMES[t]); return 1; }
    }
    using conv = std::vector<std::pair<std::string, std::string>>;
    std::vector<conv> convs = {
        // llama.cpp's test conversation
        {{"system", "You are a helpful assistant"}, {"user", "Hello"}, {"assistant", "Hi there"},
         {"user", "Who are you"}, {"assistant", "   I am an assistant   "}, {"user", "Another question"}},
        // no system message
        {{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Bye"}},
        // unusual roles, several system messages, every C isspace character around content
        {{"system", "  sys \t\n"}, {"system", "second sys\n"}, {"tool", "tool out"},
         {"user", "\x0b u \x0c"}, {"assistant_tool_call", "call"}, {"", "empty role"},
         {"function", "fn"}, {"weird", "x"}, {"assistant", "\r\n a \r\n"}, {"tool_response", " r "}},
        // empty conversation
        {},
        // a system message alone
        {{"system", " only system "}},
        // ends with the assistant
        {{"user", "q"}, {"assistant", "a"}},
        // non-ASCII content and roles; empty content; role case
        {{"system", ""}, {"user", "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac "}, {"\xc3\xbcmlaut", "x"},
         {"Assistant", " ok "}, {"USER", "up"}, {"assistant", ""}},
        // embedded NUL bytes: C strings end there
        {{"user", std::string("before\0after", 12)}, {std::string("assistant\0x", 11), "reply"}},
        // assistant first, user last, system in the middle
        {{"assistant", "first"}, {"system", "mid"}, {"user", "last"}},
    };
    printf("{\n\"conversations\": [\n");
    for (size_t c = 0; c < convs.size(); c++) {
        printf("  [");
        for (size_t m = 0; m < convs[c].size(); m++) {
            printf("%s[%s, %s]", m ? ", " : "", js(convs[c][m].first).c_str(), js(convs[c][m].second).c_str());
        }
        printf("]%s\n", c + 1 < convs.size() ? "," : "");
    }
    printf("],\n\"outputs\": [\n");
    bool first = true;
    for (int t = 0; t < LLM_CHAT_TEMPLATE_UNKNOWN; t++) {
        for (size_t c = 0; c < convs.size(); c++) {
            std::vector<llama_chat_message> msgs;
            for (auto & m : convs[c]) msgs.push_back({m.first.c_str(), m.second.c_str()});
            std::vector<const llama_chat_message *> ptrs;
            for (auto & m : msgs) ptrs.push_back(&m);
            for (int add = 0; add < 2; add++) {
                std::string dest;
                int32_t res = llm_chat_apply_template((llm_chat_template) t, ptrs, dest, add);
                if (res < 0) { fprintf(stderr, "error %d\n", t); return 1; }
                printf("%s  [%s, %zu, %s, %s]", first ? "" : ",\n", js(NAMES[t]).c_str(), c, add ? "true" : "false", js(dest).c_str());
                first = false;
            }
        }
    }
    printf("\n],\n\"detect\": [\n");
    std::vector<std::string> sources;
    {
        FILE * f = fopen("/tmp/chatlegacy/detect_sources.txt", "rb");
        std::string all; char buf[4096]; size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) all.append(buf, n);
        fclose(f);
        // one source per record, records separated by "\x1e"
        size_t p = 0;
        while (p <= all.size()) {
            size_t q = all.find('\x1e', p);
            if (q == std::string::npos) q = all.size();
            sources.push_back(all.substr(p, q - p));
            p = q + 1;
        }
    }
    for (size_t i = 0; i < sources.size(); i++) {
        llm_chat_template t = llm_chat_detect_template(sources[i]);
        printf("  [%s, %s]%s\n", js(sources[i]).c_str(), js(NAMES[t]).c_str(), i + 1 < sources.size() ? "," : "");
    }
    printf("],\n\"builtin_names\": [");
    const char * out[128];
    int32_t nb = llama_chat_builtin_templates(out, 128);
    for (int i = 0; i < nb; i++) printf("%s%s", i ? ", " : "", js(out[i]).c_str());
    printf("]\n}\n");
}
