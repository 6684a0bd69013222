// The caught-up context call timed from a separate node process, with node's own fetch (what
// the pi extension uses), so the figure holds none of the Python bench client's own delays.
// Reads one JSON request per line on stdin: {"n": id, "url": full URL, "body": request text};
// writes one JSON line per answer on stdout: {"n": id, "ms": time, "status": code, "bytes": n,
// "alone": whether no other call was in flight meanwhile}.
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";

const lines = createInterface({ input: process.stdin });
// The calls in flight: one that overlapped another ("alone": false) shares this process's event
// loop with it, so its time holds the other's parsing too, which a pi extension's one call per
// turn never has.
const active = new Set();

async function timed(request) {
  const call = { alone: active.size === 0 };
  for (const other of active) other.alone = false;
  active.add(call);
  try {
    return { ...(await fetched(request)), alone: call.alone };
  } finally {
    active.delete(call);
  }
}

async function fetched(request) {
  const started = performance.now();
  try {
    const answer = await fetch(request.url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: request.body,
    });
    const bytes = (await answer.arrayBuffer()).byteLength;
    return { n: request.n, ms: performance.now() - started, status: answer.status, bytes };
  } catch {
    return { n: request.n, ms: performance.now() - started, status: 0, bytes: 0 };
  }
}

lines.on("line", (line) => {
  timed(JSON.parse(line)).then((result) => process.stdout.write(`${JSON.stringify(result)}\n`));
});
