/**
 * End to end: the real pi CLI (node_modules, pinned node 22) in headless json mode, the scripted
 * faux model, the sessionfold extension and a fake contract server, driven by test/run-pi.mjs.
 * The probe tests pin down what pi does (README.md "What pi does, measured").
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { buildSessionContext, parseSessionEntries } from "@earendil-works/pi-coding-agent";
import { startFakeServer, type FakeServer, type Seen } from "./fake-server.ts";

const HERE = dirname(fileURLToPath(import.meta.url));
const RUN_PI = join(HERE, "run-pi.mjs");
const PROBE = join(HERE, "probe-extension.ts");

interface Run {
	exit: number;
	session_files: string[];
	stderr: string;
	dir: string;
	record: any[];
	probe: any[];
	entries: any[];
}

const readJsonl = (path: string): any[] => {
	try {
		return readFileSync(path, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l));
	} catch {
		return [];
	}
};

/** One pi session through run-pi.mjs; env adds to the process env. */
function runPi(args: string[], prompts: string[], env: Record<string, string> = {}, dir = scratch()): Promise<Run> {
	const argv = [RUN_PI, "--session-dir", join(dir, "sessions"), "--workspace", join(dir, "ws"), "--record", join(dir, "record.jsonl"),
		"--agent-dir", join(dir, "agent"), "--timeout-s", "60", ...args, "--", ...prompts];
	const childEnv = { ...process.env, SESSIONFOLD_PROBE_RECORD: join(dir, "probe.jsonl"), ...env };
	return new Promise((resolve, reject) => {
		execFile(process.execPath, argv, { env: childEnv, maxBuffer: 1 << 24 }, (error, stdout) => {
			const line = stdout.trim().split("\n").pop() ?? "";
			let result: any;
			try {
				result = JSON.parse(line);
			} catch {
				return reject(error ?? new Error(`run-pi printed no result: ${stdout}`));
			}
			resolve({
				...result,
				dir,
				record: readJsonl(join(dir, "record.jsonl")),
				probe: readJsonl(join(dir, "probe.jsonl")),
				entries: result.session_files.length ? readJsonl(result.session_files[0]) : [],
			});
		});
	});
}

const scratch = () => mkdtempSync(join(tmpdir(), "sessionfold-pi-e2e-"));

/** pi's own context at `leaf` of the one session file under `sessions`, by pi's own code: what a
 * server that folds the file holds (the request carries only the array's shape). */
function piContext(sessions: string, leaf: string | null): any[] {
	const files = (readdirSync(sessions, { recursive: true }) as string[]).filter((f) => f.endsWith(".jsonl"));
	assert.equal(files.length, 1);
	const entries = parseSessionEntries(readFileSync(join(sessions, files[0]), "utf8")).filter((e: any) => e.type !== "session");
	return buildSessionContext(entries as any, leaf).messages;
}

const stub = (id: string) => `[Summarized by the fake server: ${id}]`;

/** What the fake server renders: every tool result's content replaced by a stub naming its id. */
function render(messages: any[]): any[] {
	return messages.map((m) => (m.role === "toolResult" ? { ...m, content: [{ type: "text", text: stub(m.toolCallId) }] } : m));
}

describe("real pi with the sessionfold extension", () => {
	let server: FakeServer;
	const dirs: string[] = [];
	before(async () => {
		server = await startFakeServer();
	});
	after(async () => {
		await server.close();
		for (const d of dirs) rmSync(d, { recursive: true, force: true });
	});

	it("sends the model the server's array, and leaves the session file with the originals", async () => {
		server.seen.length = 0;
		const dir = scratch();
		server.routes.context = (seen: Seen) => {
			const body = seen.body as any;
			const messages = piContext(join(dir, "sessions"), body.leaf);
			// the shape pi's array was sent as is the file's context at the leaf
			assert.deepEqual(body.shape, messages.map((m: any) => [m.role, m.toolCallId ?? null]));
			const changed = messages.some((m: any) => m.role === "toolResult");
			return { body: changed ? { changed: true, stale: false, epoch: 1, messages: render(messages) } : { changed: false, reason: "unknown-session" } };
		};
		server.routes.recall = () => ({ body: { text: "## toolRef: t1\nrecalled output", found: 1 } });
		const script = join(tmpdir(), `sessionfold-faux-script-${process.pid}.json`);
		writeFileSync(script, JSON.stringify([
			[{ tool: "bash", args: { command: "seq 1 50" } }, { tool: "context_tree_query", args: { toolCallIds: ["t1"] } }, { text: "done" }],
			[{ tool: "bash", args: { command: "false" } }, { text: "failed as expected" }],
		]));
		const run = await runPi(["--script", script, "--extension", PROBE], ["first", "second"], { SESSIONFOLD_URL: server.url, SESSIONFOLD_TIMEOUT_MS: "5000" }, dir);
		dirs.push(run.dir);
		rmSync(script, { force: true });
		assert.equal(run.exit, 0, run.stderr);
		assert.doesNotMatch(run.stderr, /sessionfold:/);

		const header = run.entries[0];
		const contextCalls = server.seen.filter((s) => s.path.endsWith("/context"));
		const turns = run.record.filter((r) => r.kind === "turn");
		// The first call of a new session is not asked: pi writes the file only after it.
		assert.equal(contextCalls.length, turns.length - 1);
		const probed = run.probe.filter((p) => p.hook === "context");
		for (const [i, seen] of contextCalls.entries()) {
			assert.equal(seen.path, `/sessions/${header.id}/context`);
			const body = seen.body as any;
			assert.equal(body.leaf, probed[i + 1].leaf);
			// What the model received: the server's array when it changed, pi's own otherwise.
			const got = turns[i + 1].messages;
			const results = got.filter((m: any) => m.role === "toolResult");
			for (const m of results) assert.deepEqual(m.content, [{ type: "text", text: stub(m.toolCallId) }]);
			assert.equal(got.length, body.shape.length);
		}
		assert.ok(turns.some((t) => t.messages.some((m: any) => m.role === "toolResult")), "no turn saw a tool result");
		assert.ok(turns[0].tools.includes("context_tree_query"));

		// The recall went to the server, and its text is the tool result pi stored.
		const recall = server.seen.find((s) => s.path.endsWith("/recall"))!;
		assert.deepEqual(recall.body, { ids: ["t1"] });
		const stored = run.entries.filter((e) => e.type === "message" && e.message.role === "toolResult").map((e) => e.message);
		assert.equal(stored.find((m) => m.toolName === "context_tree_query").content[0].text, "## toolRef: t1\nrecalled output");
		// The file keeps the originals: rendering never touches the session.
		assert.match(stored.find((m) => m.toolName === "bash").content[0].text, /^1\n2\n3\n/);
		assert.ok(stored.some((m) => m.isError === true));
	});

	it("stores the server's compaction summary when pi auto-compacts", async () => {
		server.seen.length = 0;
		server.routes.context = () => ({ body: { changed: false } });
		const span_record = { type: "custom", customType: "sessionfold-ledger.span", data: { v: 1, payload: { span: 7 } } };
		const details = { producer: "sessionfold-ledger", span: 7 };
		server.routes.compact = () => ({ body: { status: "summary", summary: "## Goal\nsummary from sessionfold", details, span_record } });
		const run = await runPi(["--context-window", "4000", "--reserve-tokens", "1000", "--keep-recent-tokens", "800", "--extension", PROBE],
			["one", "two", "three"], { SESSIONFOLD_URL: server.url });
		dirs.push(run.dir);
		assert.equal(run.exit, 0, run.stderr);
		const compactions = run.entries.filter((e) => e.type === "compaction");
		assert.equal(compactions.length, 1);
		const [c] = compactions;
		assert.equal(c.summary, "## Goal\nsummary from sessionfold");
		assert.equal(c.fromHook, true);
		assert.deepEqual(c.details, details);
		// The span record follows the compaction entry in the file, as Longhaul writes it.
		const after = run.entries[run.entries.indexOf(c) + 1];
		assert.deepEqual([after.type, after.customType, after.data], ["custom", span_record.customType, span_record.data]);
		const req = server.seen.find((s) => s.path.endsWith("/compact"))!;
		const before = run.probe.find((p) => p.hook === "session_before_compact");
		assert.deepEqual(req.body, { first_kept_entry_id: before.firstKeptEntryId, tokens_before: before.tokensBefore, leaf: before.leaf });
		assert.equal(c.firstKeptEntryId, before.firstKeptEntryId);
		// pi's own summarizer never ran, and the model later sees the server's summary.
		assert.equal(run.record.filter((r) => r.kind === "summarize").length, 0);
		const last = run.record.at(-1);
		assert.ok(JSON.stringify(last.messages[0]).includes("summary from sessionfold"));
	});

	it("only observes when pi-condense (here a stand-in loaded after it) owns context_tree_query", async () => {
		server.seen.length = 0;
		server.routes.context = () => ({ body: { changed: true, messages: [] } }); // never asked
		server.routes.compact = () => ({ body: { status: "summary", summary: "never used" } });
		const run = await runPi(["--extension", join(HERE, "condense-standin.ts"), "--context-window", "4000", "--reserve-tokens", "1000",
			"--keep-recent-tokens", "800"], ["one", "two", "three"], { SESSIONFOLD_URL: server.url });
		dirs.push(run.dir);
		assert.equal(run.exit, 0, run.stderr);
		assert.deepEqual(server.seen.filter((s) => !s.path.endsWith("/status")), []);
		assert.match(JSON.stringify(run.record.map((r) => r.messages)), /wrote numbers\.txt/);
		assert.equal(run.entries.filter((e) => e.type === "compaction" && e.fromHook === false).length, 1);
	});

	it("fails open when the server is down: pi finishes on its own messages, with one warning", async () => {
		const dead = await startFakeServer();
		const url = dead.url;
		await dead.close();
		const run = await runPi(["--context-window", "4000", "--reserve-tokens", "1000", "--keep-recent-tokens", "800"], ["one", "two", "three"],
			{ SESSIONFOLD_URL: url });
		dirs.push(run.dir);
		assert.equal(run.exit, 0, run.stderr);
		assert.equal(run.stderr.match(/sessionfold: server unreachable/g)?.length, 1);
		// pi's own compaction ran (its summarizer was called) and every tool result went through as is.
		assert.equal(run.entries.filter((e) => e.type === "compaction" && e.fromHook === false).length, 1);
		assert.ok(run.record.some((r) => r.kind === "summarize"));
		assert.match(JSON.stringify(run.record.map((r) => r.messages)), /wrote numbers\.txt/);
	});
});

describe("what pi 0.83 does around the context event (measured)", () => {
	let run: Run;
	before(async () => {
		run = await runPi(["--no-sessionfold", "--extension", PROBE, "--context-window", "4000", "--reserve-tokens", "1000", "--keep-recent-tokens", "800"],
			["one", "two", "three"]);
	});
	after(() => rmSync(run.dir, { recursive: true, force: true }));

	it("creates the session file lazily, at the first assistant message", () => {
		const contexts = run.probe.filter((p) => p.hook === "context");
		assert.equal(contexts[0].fileExists, false);
		assert.deepEqual(contexts[0].messages.map((m: any) => m.role), ["user"]);
		assert.ok(contexts.slice(1).every((p) => p.fileExists));
		assert.deepEqual(run.entries.slice(0, 4).map((e) => e.type), ["session", "model_change", "thinking_level_change", "message"]);
	});

	it("has the leaf entry (the user prompt or the last tool result) on disk at every later context event", () => {
		const contexts = run.probe.filter((p) => p.hook === "context").slice(1);
		for (const p of contexts) {
			assert.equal(p.leafOnDisk, true);
			assert.equal(p.fileEntries.at(-1).id, p.leaf);
		}
	});

	it("sends context messages byte-identical to the file's message entries, except the compaction summary", () => {
		const last = run.probe.filter((p) => p.hook === "context").at(-1);
		const byKey = new Map<string, string>();
		for (const e of last.fileEntries) if (e.type === "message") byKey.set(`${e.message.role}@${e.message.timestamp}`, JSON.stringify(e.message));
		let matched = 0;
		for (const m of last.messages) {
			if (m.role === "compactionSummary") continue;
			assert.equal(JSON.stringify(m), byKey.get(`${m.role}@${m.timestamp}`));
			matched++;
		}
		assert.ok(matched > 3);
		const entry = last.fileEntries.find((e: any) => e.type === "compaction");
		assert.deepEqual(last.messages[0], {
			role: "compactionSummary",
			summary: entry.summary,
			tokensBefore: entry.tokensBefore,
			timestamp: Date.parse(entry.timestamp),
		});
	});

	it("fires session_before_compact headless (reason threshold) after the run, before the next prompt", () => {
		const hooks = run.probe.map((p) => p.hook);
		const at = hooks.indexOf("session_before_compact");
		assert.ok(at > 0);
		assert.equal(run.probe[at].reason, "threshold");
		assert.equal(hooks[at + 1], "session_compact");
		assert.equal(run.probe[at + 1].fromExtension, false);
		// The next context event starts from the summary, then the kept entries.
		assert.equal(run.probe[at + 2].messages[0].role, "compactionSummary");
		assert.equal(run.probe[at + 2].mode, "json");
	});
});
