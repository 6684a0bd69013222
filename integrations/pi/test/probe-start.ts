/**
 * Test-only pi extension, loaded BEFORE sessionfold's (run-pi.mjs --extension-first): at the start
 * of every `context` event it records the leaf and the session file as they were when pi asked,
 * before any handler awaited anything (pi may write to the session while a handler awaits).
 * probe-extension.ts, loaded after sessionfold's, records the array the handlers left.
 * Env: SESSIONFOLD_PROBE_RECORD, a JSONL file (lines with `hook: "context-start"`).
 */
import { appendFileSync } from "node:fs";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";
import { disk } from "./probe-extension.ts";

export default function (pi: ExtensionAPI) {
	const out = process.env.SESSIONFOLD_PROBE_RECORD;
	pi.on("context", (_event, ctx) => {
		const now = disk(ctx);
		const line = { hook: "context-start", leaf: now.leaf, fileExists: now.exists, fileEntries: now.lines };
		if (out) appendFileSync(out, `${JSON.stringify(line)}\n`);
		return undefined;
	});
}
