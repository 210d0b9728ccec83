#!/usr/bin/env python3
"""Writes the tokenizer test corpus: about 1 MB of mixed text, the same bytes on every run (seeded).

usage: make_corpus.py OUT [BYTES]

Blocks in random order: English prose, C++ and Python code, Chinese, Korean, Arabic, emoji (with ZWJ
sequences, skin tones and flags), runs of spaces/tabs/newlines, long digit runs, contractions in mixed
case, special-token strings inside text, and decomposed accents (NFC changes them: Qwen 3's normalizer).
It avoids the few characters on which the references' regex engines disagree (docs/data.md):
U+0085, U+017F and U+212A.
"""
import random
import sys

ENGLISH = ("the of and to in is was for on that with as by at from his her it an were are which this be or "
           "has had not but what all when there can who been one more no if out so said about up them time "
           "could people into year your good some these would other only new first than then its also after "
           "work well way even because any most us Meshrun trains large language models across many GPUs "
           "Tokenizers split text into pieces The QUICK Brown fox JUMPED over lazy dogs").split()
CONTRACTIONS = ["don't", "it's", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "WE'RE", "They'Ve", "I'M",
                "shouldn't've", "O'Brien's"]
CPP = """#include <vector>
namespace meshrun::train {
template <class T>
std::vector<T> scale(const std::vector<T>& xs, T k) {
    std::vector<T> out; out.reserve(xs.size());
    for (auto x : xs) { out.push_back(x * k); }  // keep the order
    return out;
}
int main(int argc, char** argv) { return argc > 1 ? 0x7F : -1; }
}  // namespace meshrun::train
"""
PYTHON = """def tokenize(text: str, *, vocab: dict[str, int]) -> list[int]:
    \"\"\"Greedy longest match.\"\"\"
    ids = []
    i = 0
    while i < len(text):
\tfor j in range(len(text), i, -1):
\t    if text[i:j] in vocab:
\t        ids.append(vocab[text[i:j]]); i = j; break
    return ids  # 42 == 0b101010
"""
CHINESE = ("我们在训练大型语言模型时需要把文本切分成词元。分词器的质量直接影响模型的效果，"
           "中文没有空格，所以每个汉字都可能是一个独立的词元。今天天气很好，我们去公园散步吧！"
           "《三体》是刘慈欣创作的长篇科幻小说，讲述了地球文明与三体文明的故事。")
KOREAN = ("한국어는 교착어이며 조사와 어미가 발달했습니다. 토크나이저는 음절 단위로 텍스트를 나눕니다. "
          "오늘 날씨가 정말 좋네요! 우리는 대규모 언어 모델을 학습시키고 있어요.")
ARABIC = ("اللغة العربية من أكثر اللغات انتشارا في العالم. يتحدثها أكثر من ٤٠٠ مليون شخص. "
          "نحن ندرب نماذج لغوية كبيرة على وحدات معالجة الرسومات.")
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🧑🏿‍💻", "👩‍🔬", "✨", "🤖", "1️⃣", "🫠"]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>", "<|end_of_text|>", "<s>", "</s>"]
DECOMPOSED = ["e\u0301", "a\u0308", "n\u0303", "o\u0302", "A\u030a", "c\u0327"]


def block(rng):
    kind = rng.randrange(11)
    if kind in (0, 1, 2):
        words = [rng.choice(ENGLISH) for _ in range(rng.randint(20, 120))]
        for _ in range(rng.randint(0, 4)):
            words.insert(rng.randrange(len(words) + 1), rng.choice(CONTRACTIONS))
        text = " ".join(words)
        return text[0].upper() + text[1:] + rng.choice([".", "!", "?", "...", ";"]) + "\n"
    if kind == 3:
        return CPP if rng.random() < 0.5 else PYTHON
    if kind == 4:
        start = rng.randrange(len(CHINESE) - 20)
        return CHINESE[start:start + rng.randint(10, 60)] + "\n"
    if kind == 5:
        start = rng.randrange(len(KOREAN) - 20)
        return KOREAN[start:start + rng.randint(10, 60)] + " "
    if kind == 6:
        start = rng.randrange(len(ARABIC) - 20)
        return ARABIC[start:start + rng.randint(10, 60)] + "\n"
    if kind == 7:
        return "".join(rng.choice(EMOJI) + rng.choice(["", " ", "", "\n"]) for _ in range(rng.randint(1, 12)))
    if kind == 8:
        return "".join(rng.choice([" ", "  ", "\t", "\n", "\r\n", "    ", "\n\n\n", " \t "]) for _ in range(rng.randint(1, 40)))
    if kind == 9:
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 300)))
        return rng.choice(["", "x=", " ", "$", "v"]) + digits + rng.choice([" ", ".", ",5 ", "\n"])
    word = rng.choice(ENGLISH)
    return rng.choice([
        " " + rng.choice(SPECIALS) + " ",
        rng.choice(SPECIALS),
        "caf" + rng.choice(DECOMPOSED) + " " + word + rng.choice(DECOMPOSED) + " ",
        "Ünïcödé façade naïve résumé — “quotes” ‘single’ … €100 £5 ¥7 © ® ™ ",
    ])


def main():
    out = sys.argv[1]
    size = int(sys.argv[2]) if len(sys.argv) > 2 else 1_000_000
    rng = random.Random(20261203)
    parts, n = [], 0
    while n < size:
        b = block(rng)
        parts.append(b)
        n += len(b.encode())
    with open(out, "w", encoding="utf-8", newline="") as f:
        f.write("".join(parts))


if __name__ == "__main__":
    main()
