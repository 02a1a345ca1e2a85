// The backend's HTTP contract (README "HTTP API"), as the page uses it. Every error a person sees comes from
// friendly(): the server's safe message and code, never a stack or a raw status line.
import { getToken } from './token';

export type AppConfig = {
  // apiUrl serves /threads; chatUrl serves /chat (in AWS the two are different function URLs, cross-origin).
  apiUrl: string;
  chatUrl: string;
  // devTokenUrl is set only by `agentloop dev`: the page asks it for a token. A deployment never sets it.
  devTokenUrl?: string;
  // limits the server enforces on a message's files (README "What a client may send").
  maxMessageBytes?: number;
};

let configPromise: Promise<AppConfig> | undefined;
let loaded: AppConfig = { apiUrl: '', chatUrl: '' };

// appConfig reads ./config.json, served beside the page by `agentloop dev` and by the API function (same origin
// unless it says otherwise).
export function appConfig(): Promise<AppConfig> {
  configPromise ??= fetch('./config.json')
    .then((r) => (r.ok ? r.json() : {}))
    .catch(() => ({}))
    .then((c: Partial<AppConfig>) => {
      loaded = { ...c, apiUrl: c.apiUrl ?? '', chatUrl: c.chatUrl || c.apiUrl || '' };
      return loaded;
    });
  return configPromise;
}

// config is the configuration appConfig loaded (main.tsx awaits it before the first render).
export const config = (): AppConfig => loaded;

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: string,
    readonly retryAfter?: number,
  ) {
    super(message);
  }
}

// friendly turns a refused response into a sentence for a person.
export function friendly(status: number, code: string, message: string, retryAfter?: number): string {
  switch (true) {
    case status === 429: {
      const wait = retryAfter && retryAfter > 0 ? ` Try again in ${retryAfter} s.` : ' Try again in a moment.';
      return `Too many requests right now.${wait}`;
    }
    case status === 409 && code === 'run_active':
      return 'A reply is still being written. Wait for it, or stop it first.';
    case status === 409 && code === 'queue_full':
      return 'Too many messages are waiting in this chat. Wait for some answers first.';
    case status === 413:
      return `That is too large to send.${message ? ' ' + message : ''}`;
    case status === 401:
      return 'You are signed out. Reload the page to sign in again.';
    case status === 404:
      return 'That chat no longer exists.';
    case status >= 500 || status === 0:
      return 'The server could not answer just now. Try again in a moment.';
    default:
      return message || 'The request was refused.';
  }
}

// refusal reads a non-2xx response's JSON error body ({"error": {code, message}}) into an ApiError.
export async function refusal(res: Response): Promise<ApiError> {
  let code = '';
  let message = '';
  try {
    const body = await res.json();
    code = String(body?.error?.code ?? '');
    message = String(body?.error?.message ?? '');
  } catch {
    // not JSON: keep only the status
  }
  const ra = Number(res.headers.get('Retry-After'));
  const retryAfter = Number.isFinite(ra) && ra > 0 ? ra : undefined;
  return new ApiError(friendly(res.status, code, message, retryAfter), res.status, code, retryAfter);
}

// authedFetch adds the bearer token and turns a refusal into an ApiError (used by the chat transport too, so the
// chat's error is the friendly sentence, not the body text).
export async function authedFetch(input: RequestInfo | URL, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  headers.set('Authorization', `Bearer ${await getToken()}`);
  let res: Response;
  try {
    res = await fetch(input, { ...init, headers });
  } catch (err) {
    if ((err as Error)?.name === 'AbortError') throw err;
    throw new ApiError(friendly(0, '', ''), 0, 'network');
  }
  if (!res.ok) throw await refusal(res);
  return res;
}

async function api<T>(path: string, init: RequestInit = {}): Promise<T> {
  const { apiUrl } = await appConfig();
  const res = await authedFetch(apiUrl + path, init);
  if (res.status === 204 || res.status === 202) {
    const text = await res.text();
    return (text ? JSON.parse(text) : undefined) as T;
  }
  return (await res.json()) as T;
}

export type Usage = {
  inputTokens?: number;
  outputTokens?: number;
  totalTokens?: number;
  costMicroUsd?: number;
};

export type ThreadSummary = { id: string; title?: string; updatedAt?: string; createdAt?: string };

export type Job = {
  id: string;
  kind: string;
  toolCallId: string;
  status: string;
  activity?: string;
  result?: unknown;
  error?: { code?: string; message?: string };
  steerDelivered?: boolean;
};

export type Queued = { messageId: string; kind: 'user' | 'steer'; jobId?: string; position: number };

export type ThreadView = {
  thread: { id: string; title?: string; usage?: Usage; activeRun?: { runId: string } };
  messages: StoredMessage[];
  activeRun?: { id: string; status: string } | null;
  jobs?: Job[];
  queued?: Queued[];
};

export type StoredMessage = {
  id: string;
  role: 'user' | 'assistant' | 'system';
  parts: any[];
  metadata?: Record<string, any>;
};

export const listThreads = () =>
  api<{ threads: ThreadSummary[] }>('/threads?limit=100').then((r) => r?.threads ?? []);

export async function getThread(id: string): Promise<ThreadView | null> {
  try {
    return await api<ThreadView>(`/threads/${encodeURIComponent(id)}?newest=true`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) return null;
    throw err;
  }
}

export const renameThread = (id: string, title: string) =>
  api(`/threads/${encodeURIComponent(id)}`, { method: 'PATCH', body: JSON.stringify({ title }), headers: { 'Content-Type': 'application/json' } });

export const deleteThread = (id: string) => api(`/threads/${encodeURIComponent(id)}`, { method: 'DELETE' });

export const stopThread = (id: string) => api(`/threads/${encodeURIComponent(id)}/stop`, { method: 'POST' });

// enqueue posts a user message behind the running reply: 202 {queued: {messageId, position}} (or a 200 stream
// when the thread went idle meanwhile, which the page then follows through the thread view).
export async function enqueue(threadId: string, message: StoredMessage): Promise<Queued | undefined> {
  const { chatUrl } = await appConfig();
  const res = await authedFetch(`${chatUrl}/chat`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ id: threadId, trigger: 'submit-message', multitask: 'enqueue', messages: [message] }),
  });
  if (res.status === 202) return (await res.json())?.queued;
  await res.body?.cancel();
  return undefined;
}
