/**
 * A tiny node:http server speaking the live-loop contract, scripted per test: each route answers
 * what the test sets, and every request is recorded (method, path, headers, JSON body).
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface Seen {
	method: string;
	path: string;
	headers: IncomingMessage["headers"];
	body: unknown;
}

/** What a route answers: a status and a body (object → JSON, string → raw bytes), after delayMs. */
export interface Reply {
	status?: number;
	body?: unknown;
	delayMs?: number;
}

export type Route = (seen: Seen) => Reply;

export interface FakeServer {
	url: string;
	seen: Seen[];
	/** Routes by the last path segment, without the query: "context", "compact", "recall", "status",
	 * "client-events", "health" (200 `{"status": "ok"}` unless set). */
	routes: Record<string, Route>;
	close(): Promise<void>;
	/** Resolves once a request to that route has arrived. */
	waitFor(route: string, timeoutMs?: number): Promise<Seen>;
}

/** Starts the fake on a free loopback port. */
export async function startFakeServer(routes: Record<string, Route> = {}, port = 0): Promise<FakeServer> {
	const seen: Seen[] = [];
	const waiters: { route: string; resolve: (s: Seen) => void }[] = [];
	const timers = new Set<NodeJS.Timeout>();
	const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
		const chunks: Buffer[] = [];
		req.on("data", (c: Buffer) => chunks.push(c));
		req.on("end", () => {
			const raw = Buffer.concat(chunks).toString("utf8");
			const path = req.url ?? "";
			const entry: Seen = { method: req.method ?? "", path, headers: req.headers, body: raw ? JSON.parse(raw) : undefined };
			seen.push(entry);
			const name = (path.split("?")[0].split("/").pop() ?? "");
			for (const w of waiters.filter((w) => w.route === name)) {
				waiters.splice(waiters.indexOf(w), 1);
				w.resolve(entry);
			}
			const route = fake.routes[name];
			const reply: Reply = route
				? route(entry)
				: name === "health"
					? { body: { status: "ok", sessions: 0 } }
					: { status: name === "client-events" ? 204 : 404, body: { error: "no route" } };
			const send = () => {
				timers.delete(timer);
				if (res.destroyed) return;
				const status = reply.status ?? 200;
				const payload = typeof reply.body === "string" ? reply.body : reply.body === undefined ? "" : JSON.stringify(reply.body);
				res.writeHead(status, { "content-type": "application/json" });
				res.end(payload);
			};
			const timer = setTimeout(send, reply.delayMs ?? 0);
			timers.add(timer);
		});
	});
	await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve));
	const bound = (server.address() as AddressInfo).port;
	const fake: FakeServer = {
		url: `http://127.0.0.1:${bound}`,
		seen,
		routes,
		close: () =>
			new Promise((resolve) => {
				for (const t of timers) clearTimeout(t);
				server.closeAllConnections();
				server.close(() => resolve());
			}),
		waitFor: (route, timeoutMs = 5000) =>
			new Promise((resolve, reject) => {
				const hit = seen.find((s) => s.path.split("?")[0].endsWith(`/${route}`));
				if (hit) return resolve(hit);
				const t = setTimeout(() => reject(new Error(`no ${route} request within ${timeoutMs} ms`)), timeoutMs);
				waiters.push({
					route,
					resolve: (s) => {
						clearTimeout(t);
						resolve(s);
					},
				});
			}),
	};
	return fake;
}
