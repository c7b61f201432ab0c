-- A small helpdesk. Ids are TEXT with a readable prefix; times are ISO-8601 strings.
CREATE TABLE agents (
    agent_id TEXT PRIMARY KEY CHECK (agent_id LIKE 'AG-%'),
    name     TEXT NOT NULL,
    on_duty  INTEGER NOT NULL CHECK (on_duty IN (0, 1))
);

CREATE TABLE tickets (
    ticket_id   TEXT PRIMARY KEY CHECK (ticket_id LIKE 'HT-%'),
    subject     TEXT NOT NULL,
    priority    TEXT NOT NULL CHECK (priority IN ('low', 'normal', 'urgent')),
    status      TEXT NOT NULL CHECK (status IN ('open', 'resolved')),
    agent_id    TEXT REFERENCES agents (agent_id),
    created_at  TEXT NOT NULL,
    resolution  TEXT,
    CHECK ((status = 'resolved') = (resolution IS NOT NULL)),
    CHECK (status = 'open' OR agent_id IS NOT NULL)
);

CREATE TABLE comments (
    comment_id TEXT PRIMARY KEY CHECK (comment_id LIKE 'CM-%'),
    ticket_id  TEXT NOT NULL REFERENCES tickets (ticket_id),
    body       TEXT NOT NULL CHECK (length(body) > 0),
    created_at TEXT NOT NULL
);
