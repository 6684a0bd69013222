/**
 * Unit tests of the extension's hooks against a fake server of the live-loop contract, with a
 * stand-in for pi's ExtensionAPI and context (the real pi runs in e2e.test.ts).
 */
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { afterEach, beforeEach, describe, it } from "node:test";
import sessionfold, { applyPatch, arrayOf, RECALL_TOOL, readConfig, type Config } from "../index.ts";
import { startFakeServer, type FakeServer } from "./fake-server.ts";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

/** A session file on disk, as pi has one once its first model call answered. */
const SESSION_FILE = join(mkdtempSync(join(tmpdir(), "sessionfold-pi-")), "sess-1.jsonl");
writeFileSync(SESSION_FILE, '{"type":"session","version":3,"id":"sess-1"}\n');

type Handler = (event: any, ctx: any) => unknown;

/** A stand-in for pi's ExtensionAPI: collects handlers and registered tools. */
function fakePi(preRegistered: string[] = []) {
	const handlers = new Map<string, Handler[]>();
	const tools: any[] = preRegistered.map((name) => ({ name }));
	const appended: { customType: string; data: unknown }[] = [];
	// pi's active tools: a tool registered is active (pi's refresh adds new names), until set.
	let active: string[] = [...preRegistered];
	const api = {
		on(name: string, handler: Handler) {
			handlers.set(name, [...(handlers.get(name) ?? []), handler]);
		},
		registerTool(def: any) {
			tools.push(def);
			active.push(def.name);
		},
		getAllTools() {
			return tools.map((t) => ({ name: t.name }));
		},
		getActiveTools() {
			return [...active];
		},
		setActiveTools(names: string[]) {
			active = names.filter((n) => tools.some((t) => t.name === n));
		},
		appendEntry(customType: string, data: unknown) {
			appended.push({ customType, data });
		},
	};
	const emit = async (name: string, event: any, ctx: any) => {
		let result: unknown;
		for (const h of handlers.get(name) ?? []) result = await h({ type: name, ...event }, ctx);
		return result;
	};
	return { api, tools, emit, appended, active: () => active };
}

/** A stand-in for pi's ExtensionContext, recording notifications and status lines. */
function fakeCtx(hasUI = true) {
	const notes: { text: string; level?: string }[] = [];
	const statuses: (string | undefined)[] = [];
	let onStatus: (() => void) | undefined;
	const ctx = {
		hasUI,
		signal: undefined as AbortSignal | undefined,
		ui: {
			notify: (text: string, level?: string) => notes.push({ text, level }),
			setStatus: (_key: string, text: string | undefined) => {
				statuses.push(text);
				onStatus?.();
			},
		},
		sessionManager: {
			getSessionId: () => "sess-1",
			getLeafId: () => "leaf-9",
			getSessionFile: () => SESSION_FILE as string | undefined,
		},
	};
	const nextStatus = () => new Promise<void>((resolve) => (onStatus = resolve));
	return { ctx, notes, statuses, nextStatus };
}

const MESSAGES = [
	{ role: "user", content: [{ type: "text", text: "hi" }], timestamp: 1 },
	{ role: "assistant", content: [{ type: "toolCall", id: "c1", name: "bash", arguments: { command: "ls" } }], timestamp: 2 },
	{ role: "toolResult", toolCallId: "c1", toolName: "bash", content: [{ type: "text", text: "a\nb" }], isError: false, timestamp: 3 },
];

function config(url: string, extra: Partial<Config> = {}): Config {
	return { ...readConfig({ SESSIONFOLD_URL: url, SESSIONFOLD_TIMEOUT_MS: "1000" }), ...extra };
}

/** A loopback port with nothing listening. */
async function deadPort(): Promise<number> {
	const srv = createServer();
	await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
	const port = (srv.address() as { port: number }).port;
	await new Promise<void>((r) => srv.close(() => r()));
	return port;
}

describe("config", () => {
	it("reads url, token and bound, and asks the server to wait less than the bound", () => {
		const cfg = readConfig({ SESSIONFOLD_URL: "http://h:1/", SESSIONFOLD_API_TOKEN: "tok", SESSIONFOLD_TIMEOUT_MS: "8000" });
		assert.equal(cfg.url, "http://h:1");
		assert.equal(cfg.token, "tok");
		assert.equal(cfg.timeoutMs, 8000);
		assert.ok(cfg.waitMs > 0 && cfg.waitMs < cfg.timeoutMs);
		const dflt = readConfig({});
		assert.equal(dflt.url, "http://127.0.0.1:6068");
		assert.equal(dflt.token, undefined);
		assert.ok(dflt.waitMs < dflt.timeoutMs);
	});
});

describe("context hook", () => {
	let server: FakeServer;
	beforeEach(async () => {
		server = await startFakeServer();
	});
	afterEach(async () => {
		await server.close();
	});

	it("returns the server's array when it changed, and sends the leaf, the array's shape and wait", async () => {
		const rendered = [MESSAGES[0], { role: "user", content: [{ type: "text", text: "stub" }], timestamp: 5 }];
		server.routes.context = () => ({ body: { changed: true, stale: false, epoch: 2, messages: rendered } });
		const pi = fakePi();
		const cfg = config(server.url);
		sessionfold(pi.api as any, cfg);
		const { ctx, notes } = fakeCtx();
		const result = (await pi.emit("context", { messages: MESSAGES }, ctx)) as any;
		assert.deepEqual(result, { messages: rendered });
		const req = server.seen.find((s) => s.path === "/sessions/sess-1/context")!;
		assert.equal(req.method, "POST");
		const shape = [
			["user", null],
			["assistant", null],
			["toolResult", "c1"],
		];
		assert.deepEqual(req.body, { leaf: "leaf-9", shape, answer: "patch", wait_ms: cfg.waitMs, sessionFile: SESSION_FILE });
		assert.equal(notes.length, 0);
	});

	it("applies a patch answer to pi's own array", async () => {
		const stubbed = { ...MESSAGES[2], content: [{ type: "text", text: "stub" }] };
		const summary = { role: "custom", customType: "s", content: "sum", display: false, timestamp: 4 };
		server.routes.context = () => ({ body: { changed: true, stale: false, epoch: 1, patch: [[0, 2], stubbed, summary] } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, notes } = fakeCtx();
		const result = (await pi.emit("context", { messages: MESSAGES }, ctx)) as any;
		assert.deepEqual(result, { messages: [MESSAGES[0], MESSAGES[1], stubbed, summary] });
		assert.equal(result.messages[0], MESSAGES[0]); // pi's own objects, not copies
		assert.equal(notes.length, 0);
	});

	it("sends the whole array when a message has no string role or tool call id", () => {
		assert.deepEqual(arrayOf(MESSAGES), { shape: MESSAGES.map((m: any) => [m.role, m.toolCallId ?? null]) });
		for (const odd of [{ content: "x" }, { role: 7 }, { role: "toolResult", toolCallId: 3 }, "user", null]) {
			const messages = [...MESSAGES, odd];
			assert.deepEqual(arrayOf(messages), { messages });
		}
	});

	it("returns nothing when unchanged, so pi keeps its own array", async () => {
		server.routes.context = () => ({ body: { changed: false, stale: false, reason: "unknown-session", epoch: 0 } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, notes } = fakeCtx();
		assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		assert.equal(notes.length, 0);
	});

	it("asks nothing for an ephemeral session (no session file)", async () => {
		server.routes.context = () => ({ body: { changed: true, messages: [] } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx } = fakeCtx();
		ctx.sessionManager.getSessionFile = () => undefined;
		assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		assert.equal(server.seen.length, 0);
	});

	it("asks nothing before pi has written the session file (a new session's first call)", async () => {
		server.routes.context = () => ({ body: { changed: true, messages: [] } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx } = fakeCtx();
		ctx.sessionManager.getSessionFile = () => join(tmpdir(), "sessionfold-pi-not-written.jsonl");
		assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		assert.equal(server.seen.length, 0);
	});

	it("fails open once when the server is down: undefined every call, one warning", async () => {
		const pi = fakePi();
		sessionfold(pi.api as any, config(`http://127.0.0.1:${await deadPort()}`));
		const { ctx, notes } = fakeCtx();
		for (let i = 0; i < 3; i++) assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		assert.equal(notes.length, 1);
		assert.equal(notes[0].level, "warning");
		assert.match(notes[0].text, /unreachable/);
	});

	it("warns on stderr when pi has no UI (print mode)", async (t) => {
		const warn = t.mock.method(console, "warn", () => {});
		const pi = fakePi();
		sessionfold(pi.api as any, config(`http://127.0.0.1:${await deadPort()}`));
		const { ctx } = fakeCtx(false);
		await pi.emit("context", { messages: MESSAGES }, ctx);
		await pi.emit("context", { messages: MESSAGES }, ctx);
		assert.equal(warn.mock.callCount(), 1);
	});

	it("is bounded by SESSIONFOLD_TIMEOUT_MS when the server is slow, and reports the timeout", async () => {
		server.routes.context = () => ({ body: { changed: true, messages: [] }, delayMs: 3000 });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url, { timeoutMs: 300, waitMs: 200 }));
		const { ctx, notes } = fakeCtx();
		const start = Date.now();
		assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		const took = Date.now() - start;
		assert.ok(took >= 250 && took < 1500, `took ${took} ms`);
		assert.match(notes[0].text, /slow/);
		const report = await server.waitFor("client-events");
		assert.deepEqual(report.body, { fail_open: 1, kind: "timeout" });
	});

	it("stops waiting when pi aborts the turn, without a warning", async () => {
		server.routes.context = () => ({ body: { changed: false }, delayMs: 3000 });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url, { timeoutMs: 5000 }));
		const { ctx, notes } = fakeCtx();
		const abort = new AbortController();
		ctx.signal = abort.signal;
		setTimeout(() => abort.abort(), 100);
		const start = Date.now();
		assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		assert.ok(Date.now() - start < 1500);
		assert.equal(notes.length, 0);
	});

	const garbage: [string, { status?: number; body?: unknown }][] = [
		["not JSON", { body: "{changed: tru" }],
		["an array", { body: [1, 2] }],
		["changed as a string", { body: { changed: "yes", messages: [] } }],
		["changed without messages", { body: { changed: true } }],
		["messages as an object", { body: { changed: true, messages: { role: "user" } } }],
		["a message without role", { body: { changed: true, messages: [{ content: "x" }] } }],
		["a message as a string", { body: { changed: true, messages: ["user"] } }],
		["a patch run past pi's array", { body: { changed: true, patch: [[0, 4]] } }],
		["an empty patch run", { body: { changed: true, patch: [[1, 1]] } }],
		["a patch run of fractions", { body: { changed: true, patch: [[0.5, 2]] } }],
		["a patch item as a string", { body: { changed: true, patch: ["user"] } }],
		["a patched message without role", { body: { changed: true, patch: [[0, 1], { content: "x" }] } }],
		["a 500", { status: 500, body: { error: "boom" } }],
		["a 401", { status: 401, body: { error: "token" } }],
		["an empty body", { body: "" }],
	];
	for (const [name, reply] of garbage) {
		it(`fails open on ${name}`, async () => {
			server.routes.context = () => reply;
			const pi = fakePi();
			sessionfold(pi.api as any, config(server.url));
			const { ctx, notes } = fakeCtx();
			assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			assert.equal(notes.length, 1);
			assert.match(notes[0].text, /unexpected answer/);
			const report = await server.waitFor("client-events");
			assert.deepEqual(report.body, { fail_open: 1, kind: "bad-answer" });
		});
	}

	it("never throws and never returns a malformed array, whatever JSON the server sends (fuzz)", async () => {
		// A seeded generator of JSON values, biased towards the contract's field names.
		let seed = 23;
		const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
		const value = (depth: number): unknown => {
			const pick = Math.floor(rnd() * (depth > 2 ? 5 : 8));
			if (pick === 0) return null;
			if (pick === 1) return rnd() < 0.5;
			if (pick === 2) return Math.floor(rnd() * 100) - 50;
			if (pick === 3) return ["user", "assistant", "toolResult", "", "x"][Math.floor(rnd() * 5)];
			if (pick === 4) return undefined;
			if (pick === 5) return Array.from({ length: Math.floor(rnd() * 4) }, () => value(depth + 1));
			const keys = ["changed", "messages", "patch", "role", "content", "stale", "epoch"];
			return Object.fromEntries(keys.filter(() => rnd() < 0.5).map((k) => [k, value(depth + 1)]));
		};
		let current: unknown;
		server.routes.context = () => ({ body: JSON.stringify(current ?? null) });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx } = fakeCtx();
		let replaced = 0;
		for (let i = 0; i < 300; i++) {
			const draw = rnd();
			current = draw < 0.3 ? { changed: true, messages: value(1) } : draw < 0.5 ? { changed: true, patch: value(1) } : value(0);
			const result = (await pi.emit("context", { messages: MESSAGES }, ctx)) as any;
			if (result === undefined) continue;
			replaced++;
			const body = current as any;
			assert.equal(body.changed, true);
			assert.deepEqual(result.messages, Array.isArray(body.patch) ? applyPatch(body.patch, MESSAGES) : body.messages);
			for (const m of result.messages) assert.equal(typeof m.role, "string");
		}
		assert.ok(replaced > 0, "the generator produced no valid changed answer");
	});
});

describe("compaction hook", () => {
	let server: FakeServer;
	beforeEach(async () => {
		server = await startFakeServer();
	});
	afterEach(async () => {
		await server.close();
	});
	const preparation = { firstKeptEntryId: "e42", tokensBefore: 12345, messagesToSummarize: [] };

	it("returns the server's summary with pi's cut point", async () => {
		const details = { producer: "sessionfold-ledger", stateFormat: 1, request: { span: 3 } };
		const span_record = { type: "custom", customType: "sessionfold-ledger.span", data: { v: 1, payload: { span: 3 } } };
		server.routes.compact = () => ({ body: { status: "summary", summary: "## Goal\nship", details, span_record } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx } = fakeCtx();
		const result = await pi.emit("session_before_compact", { preparation, signal: new AbortController().signal }, ctx);
		assert.deepEqual(result, {
			compaction: { summary: "## Goal\nship", firstKeptEntryId: "e42", tokensBefore: 12345, details },
		});
		const req = server.seen.find((s) => s.path === "/sessions/sess-1/compact")!;
		assert.deepEqual(req.body, { first_kept_entry_id: "e42", tokens_before: 12345, leaf: "leaf-9" });
		// Once pi has stored the compaction, the span record follows it, once.
		await pi.emit("session_compact", { fromExtension: true, compactionEntry: {} }, ctx);
		await pi.emit("session_compact", { fromExtension: true, compactionEntry: {} }, ctx);
		assert.deepEqual(pi.appended, [{ customType: span_record.customType, data: span_record.data }]);
	});

	it("appends no span record after pi's own compaction", async () => {
		server.routes.compact = () => ({ body: { status: "fallback", reason: "nothing-to-compact" } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx } = fakeCtx();
		await pi.emit("session_before_compact", { preparation, signal: new AbortController().signal }, ctx);
		await pi.emit("session_compact", { fromExtension: false, compactionEntry: {} }, ctx);
		assert.deepEqual(pi.appended, []);
	});

	it("lets pi compact on a fallback, without a warning", async () => {
		server.routes.compact = () => ({ body: { status: "fallback", reason: "not-caught-up" } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, notes } = fakeCtx();
		assert.equal(await pi.emit("session_before_compact", { preparation, signal: new AbortController().signal }, ctx), undefined);
		assert.equal(notes.length, 0);
	});

	it("lets pi compact on a malformed answer, with a warning", async () => {
		server.routes.compact = () => ({ body: { status: "summary", summary: 7 } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, notes } = fakeCtx();
		assert.equal(await pi.emit("session_before_compact", { preparation, signal: new AbortController().signal }, ctx), undefined);
		assert.equal(notes.length, 1);
	});

	it("honours the event's abort signal", async () => {
		server.routes.compact = () => ({ body: { status: "summary", summary: "late" }, delayMs: 3000 });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, notes } = fakeCtx();
		const abort = new AbortController();
		setTimeout(() => abort.abort(), 100);
		const start = Date.now();
		assert.equal(await pi.emit("session_before_compact", { preparation, signal: abort.signal }, ctx), undefined);
		assert.ok(Date.now() - start < 1500);
		assert.equal(notes.length, 0);
	});
});

describe("recall tool, token, observe-only, footer", () => {
	let server: FakeServer;
	beforeEach(async () => {
		server = await startFakeServer();
	});
	afterEach(async () => {
		await server.close();
	});

	it("registers context_tree_query at session start and returns the server's text", async () => {
		server.routes.recall = () => ({ body: { text: "## toolRef: t3\nTool: bash\n\nfull output", found: 1 } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx } = fakeCtx();
		await pi.emit("session_start", { reason: "startup" }, ctx);
		await pi.emit("session_start", { reason: "startup" }, ctx);
		const tools = pi.tools.filter((t) => t.name === RECALL_TOOL);
		assert.equal(tools.length, 1);
		const result = await tools[0].execute("call-1", { toolCallIds: ["t3", "c1"] }, undefined, undefined, ctx);
		assert.deepEqual(result.content, [{ type: "text", text: "## toolRef: t3\nTool: bash\n\nfull output" }]);
		assert.deepEqual(server.seen.find((s) => s.path === "/sessions/sess-1/recall")!.body, { ids: ["t3", "c1"] });
	});

	it("turns a failed recall into an error result for the model, with one warning", async () => {
		server.routes.recall = () => ({ status: 404, body: { error: "unknown session" } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, notes } = fakeCtx();
		await pi.emit("session_start", {}, ctx);
		const tool = pi.tools.find((t) => t.name === RECALL_TOOL);
		await assert.rejects(tool.execute("call-1", { toolCallIds: ["t3"] }, undefined, undefined, ctx), /unavailable/);
		assert.equal(notes.length, 1);
	});

	it("sends the bearer token on every route when configured, and none otherwise", async () => {
		server.routes.context = () => ({ body: { changed: false } });
		server.routes.compact = () => ({ body: { status: "fallback" } });
		server.routes.status = () => ({ body: { footer: "prune: ON" } });
		const withToken = fakePi();
		sessionfold(withToken.api as any, config(server.url, { token: "s3cret" }));
		const { ctx, nextStatus } = fakeCtx();
		await withToken.emit("context", { messages: MESSAGES }, ctx);
		await withToken.emit("session_before_compact", { preparation: {}, signal: new AbortController().signal }, ctx);
		const shown = nextStatus();
		await withToken.emit("turn_end", {}, ctx);
		await shown;
		assert.equal(server.seen.length, 3);
		for (const s of server.seen) assert.equal(s.headers.authorization, "Bearer s3cret");
		server.seen.length = 0;
		const without = fakePi();
		sessionfold(without.api as any, config(server.url));
		await without.emit("context", { messages: MESSAGES }, ctx);
		assert.equal(server.seen[0].headers.authorization, undefined);
	});

	it("only observes when pi-condense already owns context_tree_query", async () => {
		server.routes.context = () => ({ body: { changed: true, messages: [] } });
		server.routes.compact = () => ({ body: { status: "summary", summary: "s" } });
		server.routes.status = () => ({ body: { footer: "prune: 1 pending" } });
		const pi = fakePi([RECALL_TOOL]);
		sessionfold(pi.api as any, config(server.url));
		const { ctx, statuses, nextStatus } = fakeCtx();
		await pi.emit("session_start", {}, ctx);
		assert.equal(pi.tools.length, 1);
		assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
		assert.equal(await pi.emit("session_before_compact", { preparation: {}, signal: new AbortController().signal }, ctx), undefined);
		const shown = nextStatus();
		await pi.emit("agent_end", {}, ctx);
		await shown;
		assert.deepEqual(statuses, ["prune: 1 pending"]);
		assert.deepEqual(server.seen.map((s) => s.path), ["/sessions/sess-1/status?leaf=leaf-9&wait_ms=1500"]);
	});

	it("shows the server's footer after a turn, and clears it with one warning when the server is down", async () => {
		server.routes.status = () => ({ body: { known: true, footer: "prune: 2 pending · think 1.2k" } });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, statuses, notes, nextStatus } = fakeCtx();
		let shown = nextStatus();
		await pi.emit("turn_end", {}, ctx);
		await shown;
		assert.deepEqual(statuses, ["prune: 2 pending · think 1.2k"]);
		await server.close();
		for (let i = 0; i < 2; i++) {
			shown = nextStatus();
			await pi.emit("turn_end", {}, ctx);
			await shown;
		}
		assert.deepEqual(statuses, ["prune: 2 pending · think 1.2k", undefined, undefined]);
		assert.equal(notes.length, 1);
		server = await startFakeServer();
	});
});

/** A loopback server that accepts connections and never answers (a stopped or swapped-out
 * serve): it counts the connections and holds them until closed. */
async function hungServer() {
	const sockets = new Set<import("node:net").Socket>();
	let connections = 0;
	const srv = createServer((socket) => {
		connections++;
		sockets.add(socket);
		socket.on("close", () => sockets.delete(socket));
		socket.on("error", () => {});
	});
	await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
	const port = (srv.address() as { port: number }).port;
	return {
		url: `http://127.0.0.1:${port}`,
		connections: () => connections,
		close: () =>
			new Promise<void>((r) => {
				for (const s of sockets) s.destroy();
				srv.close(() => r());
			}),
	};
}

/** Resolves once `check` holds (polled), or fails after `ms`. */
async function until(check: () => boolean, ms = 5000) {
	const deadline = Date.now() + ms;
	while (!check()) {
		assert.ok(Date.now() < deadline, "condition not met in time");
		await new Promise((r) => setTimeout(r, 10));
	}
}

describe("a server that accepts and never answers (issue #40)", () => {
	// Short bounds, and a breaker that does not probe again within a test unless it says so.
	const hungConfig = (url: string, extra: Partial<Config> = {}) =>
		config(url, { timeoutMs: 5000, waitMs: 4000, firstByteMs: 200, probeMs: 200, backoffMs: 60000, ...extra });

	it("ends a context call past the first-byte bound and one probe, then asks nothing while the breaker is open", { timeout: 15000 }, async () => {
		const hung = await hungServer();
		const pi = fakePi();
		sessionfold(pi.api as any, hungConfig(hung.url));
		const { ctx, notes } = fakeCtx();
		try {
			let start = Date.now();
			assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			const first = Date.now() - start;
			assert.ok(first >= 350 && first < 1500, `first call took ${first} ms (bound 5000)`);
			assert.equal(notes.length, 1);
			assert.match(notes[0].text, /not answering \(context\)/);
			const seen = hung.connections();
			start = Date.now();
			for (let i = 0; i < 5; i++) assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			assert.ok(Date.now() - start < 100, "calls waited while the breaker was open");
			assert.equal(hung.connections(), seen, "calls went out while the breaker was open");
			assert.equal(notes.length, 1);
		} finally {
			await pi.emit("session_shutdown", {}, ctx);
			await hung.close();
		}
	});

	it("ends a compaction the same way, where its bound is 120 s: pi compacts itself", { timeout: 15000 }, async () => {
		const hung = await hungServer();
		const pi = fakePi();
		sessionfold(pi.api as any, hungConfig(hung.url));
		const { ctx, notes } = fakeCtx();
		try {
			const start = Date.now();
			const preparation = { firstKeptEntryId: "e1", tokensBefore: 10 };
			assert.equal(await pi.emit("session_before_compact", { preparation, signal: new AbortController().signal }, ctx), undefined);
			const took = Date.now() - start;
			assert.ok(took < 1500, `compaction waited ${took} ms`);
			assert.equal(notes.length, 1);
		} finally {
			await pi.emit("session_shutdown", {}, ctx);
			await hung.close();
		}
	});

	it("keeps waiting for a server that is slow but alive (it answers /health)", { timeout: 15000 }, async () => {
		const server = await startFakeServer();
		const rendered = [MESSAGES[0]];
		server.routes.context = () => ({ body: { changed: true, stale: false, epoch: 1, messages: rendered }, delayMs: 1200 });
		const pi = fakePi();
		sessionfold(pi.api as any, hungConfig(server.url, { firstByteMs: 100, probeEveryMs: 300 }));
		const { ctx, notes } = fakeCtx();
		try {
			assert.deepEqual(await pi.emit("context", { messages: MESSAGES }, ctx), { messages: rendered });
			assert.ok(server.seen.filter((s) => s.path === "/health").length >= 2, "no liveness probe while waiting");
			assert.equal(notes.length, 0);
		} finally {
			await pi.emit("session_shutdown", {}, ctx);
			await server.close();
		}
	});

	it("offers the recall tool only while the server answers, warns once per outage and says when it is back", { timeout: 20000 }, async () => {
		const port = await deadPort();
		const pi = fakePi();
		sessionfold(pi.api as any, config(`http://127.0.0.1:${port}`, { backoffMs: 50, backoffMaxMs: 100, probeMs: 200 }));
		const { ctx, notes } = fakeCtx();
		let server: FakeServer | undefined;
		try {
			// Down at the start: the startup probe is refused, the tool is not offered, one warning.
			await pi.emit("session_start", { reason: "startup" }, ctx);
			await until(() => notes.length === 1);
			assert.equal(notes[0].level, "warning");
			assert.match(notes[0].text, /unreachable/);
			assert.ok(!pi.active().includes(RECALL_TOOL));
			assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			// serve starts: a background probe closes the breaker, the tool is back, it is said once.
			server = await startFakeServer({ context: () => ({ body: { changed: true, messages: [MESSAGES[0]] } }) }, port);
			await until(() => pi.active().includes(RECALL_TOOL));
			assert.equal(notes.length, 2);
			assert.equal(notes[1].level, "info");
			assert.match(notes[1].text, /answers again/);
			assert.deepEqual(await pi.emit("context", { messages: MESSAGES }, ctx), { messages: [MESSAGES[0]] });
			// A second outage: warned again, the tool withdrawn again.
			await server.close();
			server = undefined;
			assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			assert.equal(notes.length, 3);
			assert.match(notes[2].text, /unreachable \(context\)/);
			assert.ok(!pi.active().includes(RECALL_TOOL));
			// A recall while down fails at once, without a call.
			const tool = pi.tools.find((t) => t.name === RECALL_TOOL);
			await assert.rejects(tool.execute("call-1", { toolCallIds: ["t3"] }, undefined, undefined, ctx), /unavailable/);
			assert.equal(notes.length, 3);
		} finally {
			await pi.emit("session_shutdown", {}, ctx);
			await server?.close();
		}
	});

	it("does not offer the recall tool when the server is hung at the start", { timeout: 15000 }, async () => {
		const hung = await hungServer();
		const pi = fakePi();
		sessionfold(pi.api as any, hungConfig(hung.url));
		const { ctx, notes } = fakeCtx();
		try {
			await pi.emit("session_start", { reason: "startup" }, ctx);
			assert.ok(!pi.active().includes(RECALL_TOOL));
			await until(() => notes.length === 1);
			assert.match(notes[0].text, /not answering \(health\)/);
			assert.ok(!pi.active().includes(RECALL_TOOL));
			const start = Date.now();
			assert.equal(await pi.emit("context", { messages: MESSAGES }, ctx), undefined);
			assert.ok(Date.now() - start < 100);
		} finally {
			await pi.emit("session_shutdown", {}, ctx);
			await hung.close();
		}
	});
});

describe("the footer (issue #40)", () => {
	it("asks the status at pi's leaf, and never drops the refresh of agent_end that follows turn_end", async () => {
		let n = 0;
		const server = await startFakeServer({ status: () => ({ body: { footer: `footer ${++n}` }, delayMs: 100 }) });
		const pi = fakePi();
		sessionfold(pi.api as any, config(server.url));
		const { ctx, statuses } = fakeCtx();
		try {
			await pi.emit("turn_end", {}, ctx);
			await pi.emit("agent_end", {}, ctx);
			await until(() => statuses.length === 2);
			assert.deepEqual(statuses, ["footer 1", "footer 2"]);
			const asked = server.seen.filter((s) => s.path.includes("/status"));
			assert.equal(asked.length, 2);
			for (const s of asked) assert.equal(s.path, "/sessions/sess-1/status?leaf=leaf-9&wait_ms=1500");
		} finally {
			await server.close();
		}
	});
});
