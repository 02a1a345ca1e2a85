import { useCallback, useEffect, useState } from 'react';
import { ApiError, deleteThread, getThread, listThreads, renameThread, type ThreadSummary, type ThreadView } from './api';
import { Chat } from './Chat';

// The thread in view lives in the URL (?t=<id>), so a reload comes back to it (and resumes its reply).
function threadFromURL(): string | null {
  return new URLSearchParams(location.search).get('t');
}

function showThread(id: string) {
  const url = new URL(location.href);
  url.searchParams.set('t', id);
  history.pushState(null, '', url);
}

export function App() {
  const [threads, setThreads] = useState<ThreadSummary[]>([]);
  const [current, setCurrent] = useState<string>(() => threadFromURL() ?? crypto.randomUUID());
  const [loaded, setLoaded] = useState<{ id: string; view: ThreadView | null } | null>(null);
  const [error, setError] = useState<string>('');

  const refresh = useCallback(() => {
    listThreads()
      .then(setThreads)
      .catch((e: Error) => setError(e.message));
  }, []);

  useEffect(refresh, [refresh]);
  useEffect(() => {
    const onPop = () => setCurrent(threadFromURL() ?? crypto.randomUUID());
    addEventListener('popstate', onPop);
    return () => removeEventListener('popstate', onPop);
  }, []);

  // The thread's stored messages are loaded before the chat mounts, so useChat starts from them and resumes a
  // running reply (resume: true) instead of showing an empty chat.
  useEffect(() => {
    let live = true;
    setLoaded(null);
    getThread(current)
      .then((view) => live && setLoaded({ id: current, view }))
      .catch((e: Error) => {
        if (!live) return;
        setError(e instanceof ApiError ? e.message : 'The chat could not be loaded.');
        setLoaded({ id: current, view: null });
      });
    return () => {
      live = false;
    };
  }, [current]);

  const open = (id: string) => {
    setError('');
    showThread(id);
    setCurrent(id);
  };

  const newChat = () => {
    const id = crypto.randomUUID();
    const url = new URL(location.href);
    url.searchParams.delete('t');
    history.pushState(null, '', url);
    setError('');
    setCurrent(id);
  };

  return (
    <div className="app">
      <nav aria-label="Threads" className="threads">
        <button type="button" className="new" onClick={newChat}>
          New chat
        </button>
        <ul>
          {threads.map((t) => (
            <ThreadItem
              key={t.id}
              thread={t}
              current={t.id === current}
              onOpen={() => open(t.id)}
              onRename={(title) =>
                renameThread(t.id, title)
                  .then(refresh)
                  .catch((e: Error) => setError(e.message))
              }
              onDelete={() =>
                deleteThread(t.id)
                  .then(() => {
                    if (t.id === current) newChat();
                    refresh();
                  })
                  .catch((e: Error) => setError(e.message))
              }
            />
          ))}
        </ul>
      </nav>
      <main className="main">
        {error && (
          <p role="alert" className="error">
            {error}
          </p>
        )}
        {loaded && loaded.id === current ? (
          <Chat
            key={current}
            threadId={current}
            initial={loaded.view}
            onSending={() => {
              // The URL names the thread before its first reply streams, so a reload mid-reply comes back to it.
              if (threadFromURL() !== current) showThread(current);
              setTimeout(refresh, 300);
            }}
            onSent={refresh}
          />
        ) : (
          <p className="loading">Loading…</p>
        )}
      </main>
    </div>
  );
}

function ThreadItem(props: {
  thread: ThreadSummary;
  current: boolean;
  onOpen: () => void;
  onRename: (title: string) => void;
  onDelete: () => void;
}) {
  const { thread, current } = props;
  const [editing, setEditing] = useState(false);
  const [title, setTitle] = useState(thread.title ?? '');
  const name = thread.title || 'Untitled chat';
  if (editing) {
    return (
      <li>
        <form
          onSubmit={(e) => {
            e.preventDefault();
            setEditing(false);
            props.onRename(title.trim());
          }}
        >
          <label>
            <span className="visually-hidden">Title</span>
            <input value={title} autoFocus onChange={(e) => setTitle(e.target.value)} onKeyDown={(e) => e.key === 'Escape' && setEditing(false)} />
          </label>
          <button type="submit">Save</button>
        </form>
      </li>
    );
  }
  return (
    <li className={current ? 'current' : undefined}>
      <a
        href={`?t=${encodeURIComponent(thread.id)}`}
        aria-current={current ? 'page' : undefined}
        onClick={(e) => {
          e.preventDefault();
          props.onOpen();
        }}
      >
        {name}
      </a>
      <button type="button" aria-label={`Rename ${name}`} onClick={() => setEditing(true)}>
        ✎
      </button>
      <button
        type="button"
        aria-label={`Delete ${name}`}
        onClick={() => {
          if (confirm(`Delete “${name}”?`)) props.onDelete();
        }}
      >
        ×
      </button>
    </li>
  );
}
