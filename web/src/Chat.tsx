import { useChat } from '@ai-sdk/react';
import {
  DefaultChatTransport,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  lastAssistantMessageIsCompleteWithToolCalls,
  type FileUIPart,
  type UIMessage,
} from 'ai';
import { useCallback, useEffect, useRef, useState } from 'react';
import { authedFetch, config, enqueue, getThread, stopThread, type Job, type Queued, type ThreadView, type Usage } from './api';
import { Composer } from './Composer';
import { MessageView } from './Message';

type Props = { threadId: string; initial: ThreadView | null; onSending: () => void; onSent: () => void };

// The chat of one thread: useChat over DefaultChatTransport, plus what useChat alone does not know about the
// backend (README "Re-syncing a useChat client"): the server's transcript is the truth after every reply, queued
// messages and job results arrive as new runs the page attaches to (resumeStream), and stop goes through the
// stop endpoint so the stored reply and the shown one end the same.
export function Chat({ threadId, initial, onSending, onSent }: Props) {
  const [view, setView] = useState<ThreadView | null>(initial);
  const [queued, setQueued] = useState<Queued[]>(initial?.queued ?? []);
  const [notice, setNotice] = useState('');
  const transport = useRef(
    new DefaultChatTransport<UIMessage>({ api: `${config().chatUrl}/chat`, fetch: authedFetch as typeof fetch }),
  ).current;

  const chat = useChat<UIMessage>({
    id: threadId,
    messages: (initial?.messages ?? []) as UIMessage[],
    transport,
    resume: initial != null,
    experimental_throttle: 50,
    // Re-post as soon as every approval (or client tool output) of the last step is answered; the client tool
    // predicate only for a message that stopped to wait (README, REVIEW H9).
    sendAutomaticallyWhen: (opts) =>
      lastAssistantMessageIsCompleteWithApprovalResponses(opts) ||
      ((opts.messages.at(-1)?.metadata as any)?.status === 'interrupted' && lastAssistantMessageIsCompleteWithToolCalls(opts)),
  });
  const { messages, status, setMessages, resumeStream } = chat;
  const busy = status === 'submitted' || status === 'streaming';

  // sync reads the thread and, while no stream runs here, takes the server's transcript and attaches to a run
  // that started without this page (a queued message's turn, a job's steer turn) or goes on without its POST (a
  // run that handed over: the POST's stream ended with metadata.handover and no finish; README "Runs longer than
  // one invocation").
  const statusRef = useRef(status);
  statusRef.current = status;
  const sync = useCallback(async () => {
    let v: ThreadView | null;
    try {
      v = await getThread(threadId);
    } catch {
      return;
    }
    if (!v) return;
    setView(v);
    setQueued(v.queued ?? []);
    const idle = statusRef.current === 'ready' || statusRef.current === 'error';
    if (!idle) return;
    setMessages((old) => (sameTranscript(old, v.messages as UIMessage[]) ? old : (v.messages as UIMessage[])));
    if (v.activeRun) {
      statusRef.current = 'submitted';
      void resumeStream();
    }
  }, [threadId, setMessages, resumeStream]);

  // Each time a stream ends here, the server's transcript replaces the client's copy (a coalesced reply, steers
  // and queued messages are in it) and a run that started meanwhile is attached to. Not on mount: useChat's
  // resume attaches to a running reply then.
  const mounted = useRef(false);
  useEffect(() => {
    if (!mounted.current) {
      mounted.current = true;
      return;
    }
    if (status === 'ready') void sync();
  }, [status, sync]);

  // The thread changes without this page while jobs run (their activity lines move, while a reply streams here
  // too), and, while nothing streams here, while job results or messages wait or a run this page is not attached
  // to holds the thread: poll it, once a second, with one poll whatever the reasons (and never a second read while
  // one is on its way).
  const waiting = (view?.jobs ?? []).some((j) => !j.steerDelivered) || queued.length > 0 || view?.activeRun != null;
  const jobsMove = (view?.jobs ?? []).some((j) => j.status === 'running' || j.status === 'pending');
  const poll = jobsMove || (waiting && !busy);
  const polling = useRef(false);
  useEffect(() => {
    if (!poll) return;
    const t = setInterval(() => {
      if (polling.current) return;
      polling.current = true;
      void sync().finally(() => (polling.current = false));
    }, 1000);
    return () => clearInterval(t);
  }, [poll, sync]);

  const stop = useCallback(() => {
    // Not chat.stop(): that only drops this tab's stream while the run goes on. The stop endpoint ends the run,
    // whose stream then ends by itself with what was stored.
    stopThread(threadId).catch(() => {});
  }, [threadId]);

  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      if (e.key === 'Escape' && (busy || view?.activeRun)) stop();
    };
    addEventListener('keydown', onKey);
    return () => removeEventListener('keydown', onKey);
  }, [busy, view?.activeRun, stop]);

  const send = async (text: string, files: FileUIPart[]) => {
    setNotice('');
    onSending();
    if (busy) {
      // A reply is running: queue the message behind it (202 with its position).
      const id = crypto.randomUUID();
      const parts = [...files, ...(text ? [{ type: 'text', text }] : [])];
      try {
        const q = await enqueue(threadId, { id, role: 'user', parts });
        if (q) setQueued((old) => [...old.filter((o) => o.messageId !== q.messageId), q]);
        onSent();
      } catch (e) {
        setNotice((e as Error).message);
      }
      return;
    }
    await chat.sendMessage({ text, files });
    onSent();
  };

  // Follow the newest message while the reader is at the bottom (not when they scrolled up to read).
  const list = useRef<HTMLDivElement>(null);
  const atBottom = useRef(true);
  useEffect(() => {
    const el = list.current;
    if (el && atBottom.current) el.scrollTop = el.scrollHeight;
  });

  const lastAssistant = messages.findLastIndex((m) => m.role === 'assistant');
  const jobs = new Map<string, Job>((view?.jobs ?? []).map((j) => [j.toolCallId, j]));

  return (
    <section className="chat" aria-label="Chat">
      <header className="chat-head">
        <h1>{view?.thread?.title || 'New chat'}</h1>
        <UsageLine usage={view?.thread?.usage} label="Thread total" />
      </header>
      <div
        className="messages"
        ref={list}
        onScroll={(e) => {
          const el = e.currentTarget;
          atBottom.current = el.scrollHeight - el.scrollTop - el.clientHeight < 40;
        }}
      >
        {messages.map((m, i) => (
          <MessageView
            key={m.id}
            message={m}
            jobs={jobs}
            canRegenerate={i === lastAssistant && i === messages.length - 1 && !busy}
            canEdit={!busy}
            onRegenerate={() => void chat.regenerate()}
            onEdit={(text) => void chat.sendMessage({ text, messageId: m.id })}
            onApprove={(id, approved, reason) => void chat.addToolApprovalResponse({ id, approved, reason })}
            onAnswer={(toolCallId, answer) =>
              void chat.addToolOutput({ tool: 'ask_user_question' as never, toolCallId, output: { answer } as never })
            }
          />
        ))}
        {status === 'submitted' && <p className="pending">Thinking…</p>}
      </div>
      {queued.length > 0 && (
        <section aria-label="Queued messages" className="queued">
          <h2>Waiting to be answered</h2>
          <ol>
            {queued.map((q) => (
              <li key={q.messageId}>
                {q.kind === 'steer' ? 'A job result' : 'Your message'} — position {q.position}
              </li>
            ))}
          </ol>
        </section>
      )}
      {(chat.error || notice) && (
        <p role="alert" className="error">
          {notice || chat.error?.message}
        </p>
      )}
      <Composer busy={busy || view?.activeRun != null} onSend={send} onStop={stop} />
    </section>
  );
}

function sameTranscript(a: UIMessage[], b: UIMessage[]): boolean {
  return a.length === b.length && a.every((m, i) => m.id === b[i].id && JSON.stringify(m.parts) === JSON.stringify(b[i].parts));
}

export function UsageLine({ usage, label }: { usage?: Usage; label: string }) {
  if (!usage || !usage.totalTokens) return null;
  const cost = usage.costMicroUsd ? ` · $${(usage.costMicroUsd / 1e6).toFixed(4)}` : '';
  return (
    <p className="usage" aria-label={label}>
      {usage.totalTokens.toLocaleString()} tokens ({(usage.inputTokens ?? 0).toLocaleString()} in,{' '}
      {(usage.outputTokens ?? 0).toLocaleString()} out){cost}
    </p>
  );
}
