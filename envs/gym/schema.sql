-- Gym booking desk. Ids are TEXT with a readable prefix.
CREATE TABLE members (
    member_id TEXT PRIMARY KEY CHECK (member_id LIKE 'G-%'),
    name      TEXT NOT NULL,
    plan      TEXT NOT NULL CHECK (plan IN ('basic', 'premium')),
    status    TEXT NOT NULL CHECK (status IN ('active', 'frozen'))
);

CREATE TABLE classes (
    class_id TEXT PRIMARY KEY CHECK (class_id LIKE 'CL-%'),
    name     TEXT NOT NULL,
    day      TEXT NOT NULL CHECK (day IN ('mon', 'tue', 'wed', 'thu', 'fri', 'sat')),
    premium  INTEGER NOT NULL CHECK (premium IN (0, 1)),
    capacity INTEGER NOT NULL CHECK (capacity > 0),
    booked   INTEGER NOT NULL CHECK (booked BETWEEN 0 AND capacity)
);

CREATE TABLE bookings (
    booking_id TEXT PRIMARY KEY CHECK (booking_id LIKE 'BK-%'),
    class_id   TEXT NOT NULL REFERENCES classes (class_id),
    member_id  TEXT NOT NULL REFERENCES members (member_id),
    status     TEXT NOT NULL CHECK (status IN ('booked', 'cancelled'))
);
