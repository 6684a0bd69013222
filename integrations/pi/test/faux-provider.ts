/**
 * Test-only pi extension: a scripted model (pi-ai's faux provider) that plays a fixed coding task
 * and records every request it receives, so tests see exactly what the model was sent.
 *
 * Load it with `pi -e test/faux-provider.ts --provider faux --model faux-1`. Env:
 *   SESSIONFOLD_FAUX_RECORD          JSONL file; one line per model call (the context it received)
 *   SESSIONFOLD_FAUX_SCRIPT          JSON file: an array of rounds (see DEFAULT_SCRIPT); optional
 *   SESSIONFOLD_FAUX_CONTEXT_WINDOW  the model's context window in tokens (small → auto-compaction)
 *
 * One round answers one user prompt: its steps are played in order, one per model call, and the
 * last step should be a text reply (it ends the agent run). Prompts past the script get a generic
 * round. Summarization calls (pi's own compaction or branch summaries) never consume a step.
 */
import { appendFileSync } from "node:fs";
import { readFileSync } from "node:fs";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";
import { fauxAssistantMessage, fauxProvider, fauxText, fauxToolCall } from "@earendil-works/pi-ai";
import type { AssistantMessage, Context } from "@earendil-works/pi-ai";

/** One scripted model answer: a tool call, or a final text reply. */
export type Step = { tool: string; args: Record<string, unknown> } | { text: string };

/** The default task: write a file, read it, run a failing command, answer; then smaller rounds. */
export const DEFAULT_SCRIPT: Step[][] = [
	[
		{ tool: "bash", args: { command: "seq 1 400 > numbers.txt && echo wrote numbers.txt" } },
		{ tool: "read", args: { path: "numbers.txt" } },
		{ tool: "bash", args: { command: "cat does-not-exist.txt" } },
		{ text: "numbers.txt has 400 lines; does-not-exist.txt is missing." },
	],
	[
		{ tool: "bash", args: { command: "seq 1 200 | awk '{print \"line \" $1}'" } },
		{ tool: "bash", args: { command: "wc -l numbers.txt" } },
		{ text: "Counted the lines again." },
	],
	[
		{ tool: "read", args: { path: "numbers.txt", offset: 100, limit: 50 } },
		{ text: "Read a slice." },
	],
];

const SUMMARIZER_MARK = "context summarization assistant";

function loadScript(): Step[][] {
	const path = process.env.SESSIONFOLD_FAUX_SCRIPT;
	if (!path) return DEFAULT_SCRIPT;
	return JSON.parse(readFileSync(path, "utf8")) as Step[][];
}

function genericRound(n: number): Step[] {
	return [{ tool: "bash", args: { command: `echo round ${n}` } }, { text: `Round ${n} done.` }];
}

export default function (pi: ExtensionAPI) {
	const script = loadScript();
	const record = process.env.SESSIONFOLD_FAUX_RECORD;
	const contextWindow = Number(process.env.SESSIONFOLD_FAUX_CONTEXT_WINDOW) || 128000;
	let round = 0;
	let step = 0;
	let call = 0;
	let toolIds = 0;

	const answer = (context: Context): AssistantMessage => {
		call += 1;
		const summarizing = (context.systemPrompt ?? "").includes(SUMMARIZER_MARK);
		const thisRound = round;
		let played: Step;
		if (summarizing) {
			played = { text: `## Goal\nfaux summary of call ${call}` };
		} else {
			const steps = round < script.length ? script[round] : genericRound(round);
			played = steps[Math.min(step, steps.length - 1)];
			step += 1;
			if ("text" in played || step >= steps.length) {
				round += 1;
				step = 0;
			}
		}
		if (record) {
			const line = {
				call,
				kind: summarizing ? "summarize" : "turn",
				round: summarizing ? null : thisRound,
				tools: (context.tools ?? []).map((t) => t.name),
				messages: context.messages,
				played,
			};
			appendFileSync(record, `${JSON.stringify(line)}\n`);
		}
		if ("text" in played) return fauxAssistantMessage(fauxText(played.text));
		toolIds += 1;
		// Deterministic ids, unique in the session: tests and the server can name them.
		return fauxAssistantMessage(fauxToolCall(played.tool, played.args, { id: `faux_call_${toolIds}` }), {
			stopReason: "toolUse",
		});
	};

	const faux = fauxProvider({
		provider: "faux",
		models: [{ id: "faux-1", name: "Faux scripted model", contextWindow, maxTokens: 4096 }],
	});
	// The faux queue holds one factory that re-queues itself: the script above decides each answer.
	const factory = (context: Context): AssistantMessage => {
		faux.appendResponses([factory]);
		return answer(context);
	};
	faux.setResponses([factory]);
	pi.registerProvider(faux.provider);
}
