"""Runs a doc's python blocks in order in one namespace, as a reader runs them top to bottom.

Usage: python doc_blocks_runner.py BLOCKS.json RESULTS.json. BLOCKS.json holds
{"doc": name, "blocks": [{"line": first source line in the doc, "source": text}]}. RESULTS.json
gets, per block run, its line, whether it ran, the error's traceback, and what each print() call
printed with the doc line of that call. The run stops at the first block that raises: the later
blocks would fail on names it did not define.
"""

import builtins
import io
import json
import sys
import traceback


def main(blocks_path: str, results_path: str) -> int:
    with open(blocks_path, encoding="utf-8") as f:
        spec = json.load(f)
    namespace = {"__name__": "__main__"}
    real_print = builtins.print
    results = []
    current = {}

    def recording_print(*args, **kwargs):
        if kwargs.get("file") is None:
            text = io.StringIO()
            real_print(*args, **{**kwargs, "file": text})
            caller = sys._getframe(1)
            if caller.f_code.co_filename == current["filename"]:
                current["prints"].append({"line": current["first"] + caller.f_lineno - 1,
                                          "text": text.getvalue()})
        real_print(*args, **kwargs)
        sys.stdout.flush()

    builtins.print = recording_print
    for block in spec["blocks"]:
        filename = f"{spec['doc']}:{block['line']}"
        current = {"filename": filename, "first": block["line"], "prints": []}
        result = {"line": block["line"], "ok": True, "error": None, "prints": current["prints"]}
        results.append(result)
        real_print(f"----- {filename}", flush=True)
        try:
            exec(compile(block["source"], filename, "exec"), namespace)
        except BaseException:  # noqa: BLE001  (SystemExit too: the block's failure is the report)
            result["ok"] = False
            result["error"] = traceback.format_exc()
            break
    builtins.print = real_print
    with open(results_path, "w", encoding="utf-8") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
