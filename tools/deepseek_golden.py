#!/usr/bin/env python3
"""Golden ids for DeepSeek-V3's tokenizer.json from the Hugging Face `tokenizers` library.

Writes tests/fixtures/tokenizers/deepseek_v3_golden.json: for each text of a deterministic
corpus (hand-written cases plus seeded random mixtures), the ids of
  markup:  Tokenizer.from_file(json).encode(text, add_special_tokens=False)
           (added tokens in the text become their ids, as in a chat template)
  content: the same tokenizer with its added_tokens list emptied, so every added-token
           string is ordinary text (what waste's `encode` promises).

Usage (no torch needed):
    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
    /tmp/tokvenv/bin/python tools/deepseek_golden.py tests/fixtures/tokenizers/deepseek_v3_tokenizer.json \
        tests/fixtures/tokenizers/deepseek_v3_golden.json
"""
import hashlib
import json
import random
import sys

import tokenizers
from tokenizers import Tokenizer

HAND = [
    "", "Hello world", "Hello, World! How are you today?", "The quick brown fox jumps over the lazy dog.",
    " leading space", "trailing space ", "double  space  here", " ", "  ", " " * 17, "     word",
    "\t\tindented\twith\ttabs\t", "line1\nline2\n", "line1\r\nline2\r\n", "\n\n\n\nend", "  \n \t\n   x  \n",
    "\n\n", "code   \n    more", "a\n\n\n  \n b", "x \n\n", "   \n", "\r\r\n\n\r",
    "I'm you're he's we've they'll I'd don't can't won't", "I'M YOU'RE HE'S WE'VE THEY'LL I'D DON'T",
    "it\u2019s they\u2019re", "'s 't 're 've 'm 'll 'd", "rock'n'roll", "O'Neil's dog", "'''triple'''",
    "1 12 123 1234 12345 123456 1234567 12345678 123456789 1234567890",
    "3141592653589793238462643383279502884197", "3.14159 1,000,000 2024-01-01 0x1F 1e-5 v1.2.3 $9.99 50%",
    "\u0661\u0662\u0663 \u0967\u0968\u0969 \u2460\u2461 \uff11\uff12\uff13", "a1b22c333d4444", "第3章第12节",
    "def foo(x: int) -> int:\n    return x ** 2  # square\n\nprint(foo(3))\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * 2).collect();\n    println!(\"{:?}\", v);\n}\n",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "<div class=\"x\"><a href='https://example.com/path?q=1&r=2'>link</a></div>",
    "C:\\Users\\name\\file.txt /usr/local/bin/python3 ./a/b/../c",
    r"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@\w+\.\w{2,}$",
    "camelCaseIdentifier snake_case_name SCREAMING_CASE iPhone McDonald's XMLHttpRequest",
    "#include <stdio.h>\nint main(void){printf(\"%d\\n\", 42);}", "SELECT * FROM t WHERE a >= 10 AND b <> 'x';",
    "$ ls -la | grep .rs && echo \"done\"", "x+=1;y-=2;z*=3", "--flag=value -abc", "...!!!???",
    "@user #hashtag https://t.co/abc", ".NET _private __dunder__ -dash", "(a)[b]{c}<d>",
    "你好，世界！今天天气很好。", "日本語のテキストです。カタカナとひらがな", "한국어 텍스트입니다",
    "Hello世界abc测试123数据", "中文English混合mixed文本", "「引用」『二重』【括弧】", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ",
    "鿦鿧 龥龦", "㐀㐁 𠀀𠀁", "ー々〆〤", "مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ", "שלום עולם",
    "नमस्ते दुनिया", "हिन्दी में लिखा गया वाक्य।", "สวัสดีชาวโลก", "ภาษาไทยไม่มีช่องว่าง",
    "Привет, мир! Это тест.", "Καλημέρα κόσμε", "café naïve Ærøskøbing Straße Łódź",
    "e\u0301 a\u0308 n\u0303 (decomposed accents)", "Z\u0351\u036b\u0343a\u0310\u0301l\u0357g\u0315o", "\u0301start with mark",
    "ǅemal ǈubljana", "ﬁnance ﬂow", "ΑΒΓ αβγ", "Ⅻ ⅻ ↀ", "ℌ𝔢𝔩𝔩𝔬 𝕎𝕠𝕣𝕝𝕕",
    "\U0001F600 \U0001F44D \U0001F680", "\U0001F44D\U0001F3FD", "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
    "\U0001F1FA\U0001F1F8\U0001F1EF\U0001F1F5", "\u2764\ufe0f 1\ufe0f\u20e3", "\U0001F600" * 20,
    "\U0001F469\U0001F3FD\u200d\U0001F4BB at work", "\U0001F3F3\ufe0f\u200d\U0001F308", "I \u2764 NY",
    "a\u0000b", "\u0001\u0002\u007f\u001b[0m", "\ufeffBOM at start", "bad \ufffd byte", "zero\u200bwidth\u200cnon\u200djoiner",
    "a\u00a0b\u3000c\u2009d", "a\u2028b\u2029c\u0085d", "\U0010FFFF\U000E0001", "\ue000\uf8ff", "\x0b\x0c vertical",
    "\u00ff\u00fe\u00fd", "Ã©tÃ© mojibake", "\\xff\\xfe\\x00", "\\ud800 not a surrogate", "À¯ overlong-looking",
    "\u00ad soft hyphen", "x\u0345\U00010D24 a\u0345\u1DF6\u0301 o\u0345\U0001E000\u0323", "\u1100\u1161\u11a8 \u212b \u0f73", "\u202eRLO override\u202c", "a" * 2000, " " * 500, "7" * 300,
    ("lorem ipsum dolor sit amet " * 40).strip(), "ab" * 700, "😀a" * 100, "\n" * 50, "- " * 100,
    "<|endoftext|>", "hello<|endoftext|>world", "<｜begin▁of▁sentence｜>Hello", "<｜User｜>hi<｜Assistant｜>hey",
    "<｜end▁of▁sentence｜>", "<｜fim▁begin｜>def f():<｜fim▁hole｜>\n<｜fim▁end｜>", "<think>\nhmm\n</think>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "text <｜User｜> more", "<｜User｜<｜User｜>>", "<｜place▁holder▁no▁5｜>",
]


def random_texts(n, seed):
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "你好世界中文字符测试数据模型", "ひらがなカタカナ", "مرحبابالعالم", "नमस्तेदुनिया", "สวัสดีชาวโลก",
        "\u0301\u0308\u0303\u0323", "\u200d\ufe0f\U0001F3FD\U0001F468\U0001F469\U0001F600", "\u0000\u0001\u001b\u007f\u0085\u00a0\u2028",
        "éüñßøłçÆ", "１２３①②", "'s't're'll",
    ]
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        s = "".join(rng.choice(rng.choice(pools)) for _ in range(k))
        out.append(s)
    return out


def main():
    src, dst = sys.argv[1], sys.argv[2]
    raw = open(src, "rb").read()
    markup = Tokenizer.from_str(raw.decode("utf-8"))
    doc = json.loads(raw)
    doc["added_tokens"] = []
    content = Tokenizer.from_str(json.dumps(doc))
    texts = HAND + random_texts(150, 20261129)
    cases = []
    for t in texts:
        m = markup.encode(t, add_special_tokens=False).ids
        c = content.encode(t, add_special_tokens=False).ids
        cases.append({"text": t, "markup": m, "content": c})
    out = {
        "generator": "tools/deepseek_golden.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer_json_sha256": hashlib.sha256(raw).hexdigest(),
        "cases": cases,
    }
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{len(cases)} cases -> {dst}")


if __name__ == "__main__":
    main()
