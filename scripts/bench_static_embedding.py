"""Could a static embedding distilled from the bundled model replace it on the request path?

Runs every WordPiece token of all-MiniLM-L6-v2 through the bundled int8 ONNX model once
(`[CLS] token [SEP]`, mean over the three outputs: the model2vec recipe, without torch),
then embeds a text as the normalised mean of its tokens' rows, and measures on the labelled
set (scripts/data/recall_set.json, the fragments plus 500 generated sentences, as
`bench_memory.py --only quality`): recall@5 of the static vectors alone (raw, centred, PCA
to 256 dimensions with SIF weights by token rank) and as a first stage whose top K are
re-ranked by the model's own vectors. Prints the distillation's CPU time, the table's size,
a static embedding's cost and the recall figures; asserts nothing.

    python scripts/bench_static_embedding.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_memory import RECALL_SET, sentences  # noqa: E402


def distil(embedder):  # type: ignore[no-untyped-def]
    import numpy as np

    session, size = embedder._session, embedder._tokenizer.get_vocab_size()
    table = np.zeros((size, 384), dtype=np.float32)
    for start in range(0, size, 1024):
        ids = np.arange(start, min(size, start + 1024), dtype=np.int64)
        batch = np.stack([np.full_like(ids, 101), ids, np.full_like(ids, 102)], axis=1)
        hidden = session.run(None, {"input_ids": batch, "attention_mask": np.ones_like(batch),
                                    "token_type_ids": np.zeros_like(batch)})[0]
        table[start:start + len(ids)] = hidden.mean(axis=1)
    return table


def variants(raw):  # type: ignore[no-untyped-def]
    import numpy as np

    centred = raw - raw.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    rank = 1.0 / (np.arange(len(raw)) + 1.0)
    sif = 1e-4 / (1e-4 + rank / rank.sum())  # token ids stand in for frequency ranks
    return {"raw mean": raw, "centred": centred,
            "PCA 256 + SIF": ((centred @ vt[:256].T) * sif[:, None]).astype(np.float32)}


def main() -> None:
    from agentd.memory.embedder import LocalEmbedder, import_numpy

    import_numpy()
    import numpy as np

    embedder = LocalEmbedder()
    embedder.load()
    tokenizer = embedder._tokenizer
    labelled = json.loads(RECALL_SET.read_text(encoding="utf-8"))
    items = labelled["fragments"] + [{"id": f"noise{n}", "content": t} for n, t in enumerate(sentences(500, 7))]
    names = [f["id"] for f in items]
    queries = labelled["queries"]
    model_rows = embedder.embed([f["content"] for f in items])
    model_queries = embedder.embed([q["query"] for q in queries])

    started = time.process_time()
    raw = distil(embedder)
    print(f"distilling {len(raw):,} tokens: {time.process_time() - started:.1f} s CPU; table "
          f"{raw.nbytes / 2**20:.1f} MiB as float32 x 384, {len(raw) * 256 * 2 / 2**20:.1f} MiB as float16 x 256")

    def static(table, texts):  # type: ignore[no-untyped-def]
        out = []
        for text in texts:
            ids = tokenizer.encode(text, add_special_tokens=False).ids or [100]
            vector = table[ids].mean(axis=0)
            out.append(vector / max(float(np.linalg.norm(vector)), 1e-12))
        return np.asarray(out, dtype=np.float32)

    def recall(stage1_rows, stage1_queries, k: int) -> tuple[float, float]:
        """(share with the relevant fragment in the first stage's top k, recall@5 after the
        model's vectors re-rank those k)."""
        first = final = 0
        for at, q in enumerate(queries):
            top = np.argsort(-(stage1_rows @ stage1_queries[at]))[:k]
            best = top[np.argsort(-(model_rows[top] @ model_queries[at]))][:5]
            first += any(names[i] in q["relevant"] for i in top)
            final += any(names[i] in q["relevant"] for i in best)
        return first / len(queries) * 100, final / len(queries) * 100

    print(f"the model's own vectors, exact top 5: recall@5 {recall(model_rows, model_queries, 5)[1]:.1f} %")
    for label, table in variants(raw).items():
        rows, asked = static(table, [f["content"] for f in items]), static(table, [q["query"] for q in queries])
        cells = [f"alone {recall(rows, asked, 5)[1]:.1f} %"]
        for k in (20, 50, 100):
            first, final = recall(rows, asked, k)
            cells.append(f"top {k} then re-ranked {final:.1f} % (first stage holds it {first:.1f} %)")
        print(f"static, {label}: recall@5 " + "; ".join(cells))
    text = "User asked: hello\nI responded: Hello from the upstream."
    table = variants(raw)["PCA 256 + SIF"]
    started = time.process_time()
    for _ in range(1000):
        static(table, [text])
    print(f"a static embedding of a short exchange: {(time.process_time() - started):.3f} ms CPU")


if __name__ == "__main__":
    main()
