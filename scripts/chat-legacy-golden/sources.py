import json
cases = json.load(open('/tmp/chatlegacy/cases.json'))
names = ["chatml","llama2","llama2-sys","llama2-sys-bos","llama2-sys-strip","mistral-v1","mistral-v3","mistral-v3-tekken","mistral-v7","mistral-v7-tekken","phi3","phi4","falcon3","zephyr","monarch","gemma","orion","openchat","vicuna","vicuna-orca","deepseek","deepseek2","deepseek3","deepseek-ocr","command-r","llama3","chatglm3","chatglm4","glmedge","minicpm","exaone3","exaone4","exaone-moe","rwkv-world","granite","granite-4.0","granite-4.1","gigachat","megrez","yandex","bailing","bailing-think","bailing2","llama4","smolvlm","hunyuan-moe","gpt-oss","hunyuan-dense","hunyuan-vl","kimi-k2","seed_oss","grok-2","pangu-embedded","solar-open"]
crafted = ["", "INVALID TEMPLATE", " chatml", "chatml ", "ChatML", "dots1", "unknown",
 "<|im_start|>", "<|im_start|><|im_sep|>", "<|im_start|><end_of_utterance>", "<|im_start|><|im_sep|><end_of_utterance>", "<|im_start|>[INST]",
 "mistral", "mistralfoo", "xmistral", "mistral[SYSTEM_PROMPT]", "[INST]", "[INST][SYSTEM_PROMPT]",
 "' [INST] ' + system_message", "[INST][AVAILABLE_TOOLS]", "\"[INST]\"[AVAILABLE_TOOLS]", "x [INST][AVAILABLE_TOOLS]\"[INST]\"",
 "[INST]<<SYS>>", "[INST]bos_token + '[INST]", "[INST]content.strip()", "[INST]<<SYS>>content.strip()bos_token + '[INST]", "[INST]<<SYS>>bos_token + '[INST]",
 "<|assistant|><|end|>", "<|assistant|><|end|><|user|>", "[gMASK]<sop>", "<|assistant|><|user|>", "<|assistant|><|user|><|tool_declare|>", "<|assistant|><|user|></s>",
 "<|assistant|><|user|></s><|tool_declare|>", "<|{{ item['role'] }}|><|begin_of_image|>", "<|user|><|endoftext|>", "<|user|><|endoftext|><start_of_turn>",
 "bos_token + message['role']", "<start_of_turn>", "'\\n\\nAssistant: ' + eos_token", "'\n\nAssistant: ' + eos_token", "GPT4 Correct ", "USER: ASSISTANT: ",
 "USER: ASSISTANT: SYSTEM: ", "USER: ", "### Instruction:<|EOT|>", "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|start_header_id|><|end_header_id|>",
 "<|im_start|><|start_header_id|><|end_header_id|>", "[gMASK]sop", "<用户>", "'Assistant: ' + message['content'] + eos_token",
 "<｜Assistant｜><｜User｜><｜end▁of▁sentence｜>", "<｜Assistant｜><｜User｜>", "[|system|][|assistant|][|endofturn|]", "[|system|][|assistant|][|endofturn|][|tool|]",
 "xrwkv-world", "{{- 'User: ' + message['content']|trim + '\\n\\n' -}}", "<|start_of_role|>", "<|start_of_role|><tool_call>", "<|start_of_role|><tools>",
 "<|start_of_role|><tools>g4_default_system_message", "g4_default_system_message<|start_of_role|>",
 "message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]", "<|role_start|>", " Ассистент:", "Ассистент:",
 "<role>ASSISTANT</role>'HUMAN'", "<role>ASSISTANT</role>\"HUMAN\"<think>", "<role>ASSISTANT</role>\"HUMAN\"", "<role>ASSISTANT</role><role>HUMAN</role><|role_end|>",
 "<role>ASSISTANT</role>'HUMAN'<role>HUMAN</role><|role_end|>\"HUMAN\"<think>",
 "<|header_start|><|header_end|>", "<|endofuserprompt|>", "<|extra_0|><|extra_4|>", "<|start|><|channel|>", "<|start|><|channel|><|end|><|assistant|>",
 "<｜hy_Assistant｜><｜hy_begin▁of▁sentence｜>", "<｜hy_Assistant｜><｜hy_place▁holder▁no▁3｜>", "<｜hy_Assistant｜><｜hy_place▁holder▁no▁3｜><｜hy_begin▁of▁sentence｜>",
 "<|im_assistant|>assistant<|im_middle|>", "<seed:bos>", "'Assistant: '  + message['content'] + '<|separator|>", "'Assistant: ' + message['content'] + '<|separator|>",
 "[unused9]系统：[unused10]", "<|begin|><|end|><|content|>", "<|begin|><|end|>",
]
srcs = crafted + names + [c['template'] for c in cases]
assert not any('\x1e' in s or '\0' in s for s in srcs)
open('/tmp/chatlegacy/detect_sources.txt', 'w', encoding='utf-8', newline='').write('\x1e'.join(srcs))
print(len(srcs))
