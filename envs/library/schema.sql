-- Lending library. Ids are TEXT with a readable prefix; dates are 'YYYY-MM-DD'.
CREATE TABLE members (
    member_id TEXT PRIMARY KEY CHECK (member_id LIKE 'M-%'),
    name      TEXT NOT NULL,
    email     TEXT NOT NULL UNIQUE CHECK (email LIKE '%_@_%'),
    status    TEXT NOT NULL CHECK (status IN ('active', 'suspended')),
    max_loans INTEGER NOT NULL CHECK (max_loans BETWEEN 1 AND 10)
);

CREATE TABLE books (
    book_id          TEXT PRIMARY KEY CHECK (book_id LIKE 'B-%'),
    title            TEXT NOT NULL,
    author           TEXT NOT NULL,
    genre            TEXT NOT NULL CHECK (genre IN ('fiction', 'history', 'science', 'children', 'poetry')),
    copies_total     INTEGER NOT NULL CHECK (copies_total >= 1),
    copies_available INTEGER NOT NULL CHECK (copies_available BETWEEN 0 AND copies_total)
);

CREATE TABLE loans (
    loan_id     TEXT PRIMARY KEY CHECK (loan_id LIKE 'L-%'),
    book_id     TEXT NOT NULL REFERENCES books (book_id),
    member_id   TEXT NOT NULL REFERENCES members (member_id),
    loaned_on   TEXT NOT NULL,
    due_on      TEXT NOT NULL,
    returned_on TEXT,
    status      TEXT NOT NULL CHECK (status IN ('active', 'returned')),
    CHECK ((status = 'returned') = (returned_on IS NOT NULL)),
    CHECK (due_on > loaned_on)
);

CREATE TABLE holds (
    hold_id   TEXT PRIMARY KEY CHECK (hold_id LIKE 'H-%'),
    book_id   TEXT NOT NULL REFERENCES books (book_id),
    member_id TEXT NOT NULL REFERENCES members (member_id),
    placed_on TEXT NOT NULL,
    status    TEXT NOT NULL CHECK (status IN ('waiting', 'cancelled'))
);
