-- IT service desk of Brightwell Analytics. Ids are TEXT with a readable prefix.
-- Times are ISO-8601 strings ('2025-03-14T09:00:00'); dates are 'YYYY-MM-DD'.

CREATE TABLE departments (
    department_id TEXT PRIMARY KEY CHECK (department_id LIKE 'D-%'),
    name          TEXT NOT NULL UNIQUE,
    cost_center   TEXT NOT NULL UNIQUE
);

CREATE TABLE employees (
    employee_id   TEXT PRIMARY KEY CHECK (employee_id LIKE 'E-%'),
    first_name    TEXT NOT NULL,
    last_name     TEXT NOT NULL,
    email         TEXT NOT NULL UNIQUE CHECK (email LIKE '%_@_%'),
    department_id TEXT NOT NULL REFERENCES departments (department_id),
    role          TEXT NOT NULL CHECK (role IN ('staff', 'manager', 'executive')),
    title         TEXT NOT NULL,
    manager_id    TEXT REFERENCES employees (employee_id),
    status        TEXT NOT NULL CHECK (status IN ('active', 'on_leave', 'terminated')),
    hire_date     TEXT NOT NULL,
    CHECK (manager_id IS NULL OR manager_id <> employee_id)
);

-- Service levels per priority: hours from creation to the expected first response and resolution.
CREATE TABLE sla_rules (
    priority         TEXT PRIMARY KEY CHECK (priority IN ('low', 'medium', 'high', 'critical')),
    response_hours   INTEGER NOT NULL CHECK (response_hours > 0),
    resolution_hours INTEGER NOT NULL CHECK (resolution_hours >= response_hours)
);

CREATE TABLE assets (
    asset_id      TEXT PRIMARY KEY CHECK (asset_id LIKE 'A-%'),
    asset_type    TEXT NOT NULL CHECK (asset_type IN ('laptop', 'phone', 'monitor', 'tablet')),
    model         TEXT NOT NULL,
    serial_number TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL CHECK (status IN ('in_stock', 'assigned', 'in_repair', 'retired')),
    assigned_to   TEXT REFERENCES employees (employee_id),
    purchase_date TEXT NOT NULL,
    -- an asset has a holder exactly when it is assigned
    CHECK ((status = 'assigned') = (assigned_to IS NOT NULL))
);

-- At most one laptop and one phone per employee.
CREATE UNIQUE INDEX one_laptop_or_phone_each ON assets (assigned_to, asset_type)
    WHERE assigned_to IS NOT NULL AND asset_type IN ('laptop', 'phone');

CREATE TABLE licenses (
    license_id  TEXT PRIMARY KEY CHECK (license_id LIKE 'L-%'),
    product     TEXT NOT NULL UNIQUE,
    vendor      TEXT NOT NULL,
    seat_limit  INTEGER NOT NULL CHECK (seat_limit >= 0),
    seats_used  INTEGER NOT NULL CHECK (seats_used >= 0 AND seats_used <= seat_limit),
    expires_on  TEXT NOT NULL
);

CREATE TABLE license_assignments (
    license_id  TEXT NOT NULL REFERENCES licenses (license_id),
    employee_id TEXT NOT NULL REFERENCES employees (employee_id),
    PRIMARY KEY (license_id, employee_id)
);

CREATE TABLE tickets (
    ticket_id    TEXT PRIMARY KEY CHECK (ticket_id LIKE 'T-%'),
    requester_id TEXT NOT NULL REFERENCES employees (employee_id),
    assignee_id  TEXT REFERENCES employees (employee_id),
    category     TEXT NOT NULL CHECK (category IN ('hardware', 'software', 'access', 'network', 'account', 'other')),
    priority     TEXT NOT NULL REFERENCES sla_rules (priority),
    status       TEXT NOT NULL CHECK (status IN ('open', 'in_progress', 'on_hold', 'resolved', 'closed')),
    subject      TEXT NOT NULL CHECK (length(subject) > 0),
    description  TEXT NOT NULL,
    asset_id     TEXT REFERENCES assets (asset_id),
    created_at   TEXT NOT NULL,
    due_at       TEXT NOT NULL,
    resolved_at  TEXT,
    resolution   TEXT,
    -- 'open' means nobody is assigned yet; every later status has an assignee
    CHECK ((status = 'open') = (assignee_id IS NULL)),
    -- resolved and closed tickets carry when and how they were resolved; others do not
    CHECK ((status IN ('resolved', 'closed')) = (resolved_at IS NOT NULL)),
    CHECK ((status IN ('resolved', 'closed')) = (resolution IS NOT NULL)),
    CHECK (due_at > created_at),
    CHECK (resolved_at IS NULL OR resolved_at >= created_at)
);

CREATE TABLE ticket_comments (
    comment_id  TEXT PRIMARY KEY CHECK (comment_id LIKE 'C-%'),
    ticket_id   TEXT NOT NULL REFERENCES tickets (ticket_id),
    author_id   TEXT NOT NULL REFERENCES employees (employee_id),
    body        TEXT NOT NULL CHECK (length(body) > 0),
    is_internal INTEGER NOT NULL DEFAULT 0 CHECK (is_internal IN (0, 1)),
    created_at  TEXT NOT NULL
);

-- Lookups by owner: an employee's assets, licenses and tickets (requested or assigned), a
-- ticket's comments. The tables are small, but tools make these lookups on every call, and
-- without an index each one reads the whole table.
CREATE INDEX assets_by_holder ON assets (assigned_to);
CREATE INDEX license_assignments_by_employee ON license_assignments (employee_id);
CREATE INDEX tickets_by_requester ON tickets (requester_id);
CREATE INDEX tickets_by_assignee ON tickets (assignee_id);
CREATE INDEX ticket_comments_by_ticket ON ticket_comments (ticket_id);
