-- τ²-bench's airline DB (flights, users, reservations: nested JSON) as relational tables.
--
-- Every `position` column gives back τ²'s exact order: dict-valued fields (a flight's dates, a
-- user's payment methods) keep db.json's insertion order and lists (a user's reservations, a
-- reservation's segments, passengers and payments) keep theirs, because the agent sees them in
-- that order. A user's saved passengers, which no tool changes or queries, are JSON text.

CREATE TABLE flights (
    flight_number TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    origin TEXT NOT NULL,
    destination TEXT NOT NULL,
    scheduled_departure_time_est TEXT NOT NULL,
    scheduled_arrival_time_est TEXT NOT NULL
);

-- One flight on one date. Which columns are set follows `status`, as τ²'s six FlightDateStatus
-- models do: seats and prices only when available, actual/estimated times otherwise.
CREATE TABLE flight_dates (
    flight_number TEXT NOT NULL REFERENCES flights (flight_number),
    date TEXT NOT NULL,
    position INTEGER NOT NULL CHECK (position >= 0),
    status TEXT NOT NULL CHECK (status IN ('available', 'landed', 'cancelled', 'on time', 'flying', 'delayed')),
    seats_basic_economy INTEGER,
    seats_economy INTEGER,
    seats_business INTEGER,
    price_basic_economy INTEGER,
    price_economy INTEGER,
    price_business INTEGER,
    actual_departure_time_est TEXT,
    actual_arrival_time_est TEXT,
    estimated_departure_time_est TEXT,
    estimated_arrival_time_est TEXT,
    PRIMARY KEY (flight_number, date),
    UNIQUE (flight_number, position),
    CHECK ((status = 'available') = (seats_economy IS NOT NULL AND price_economy IS NOT NULL))
);

CREATE TABLE users (
    user_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    address1 TEXT NOT NULL,
    address2 TEXT NOT NULL,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    state TEXT NOT NULL,
    zip TEXT NOT NULL,
    email TEXT NOT NULL,
    dob TEXT NOT NULL,
    saved_passengers TEXT NOT NULL CHECK (json_valid(saved_passengers) AND json_type(saved_passengers) = 'array'),
    membership TEXT NOT NULL CHECK (membership IN ('gold', 'silver', 'regular'))
);

-- τ²'s three payment-method models in one table: which columns are set follows `source`. A
-- certificate used in a booking is deleted (τ² pops it from the user's dict).
CREATE TABLE payment_methods (
    user_id TEXT NOT NULL REFERENCES users (user_id),
    payment_method_id TEXT NOT NULL,
    position INTEGER NOT NULL CHECK (position >= 0),
    source TEXT NOT NULL CHECK (source IN ('credit_card', 'gift_card', 'certificate')),
    brand TEXT,
    last_four TEXT,
    amount REAL,
    PRIMARY KEY (user_id, payment_method_id),
    UNIQUE (user_id, position),
    CHECK ((source = 'credit_card') = (brand IS NOT NULL AND last_four IS NOT NULL)),
    CHECK ((source = 'credit_card') = (amount IS NULL))
);

-- A user's `reservations` list, in order.
CREATE TABLE user_reservations (
    user_id TEXT NOT NULL REFERENCES users (user_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    reservation_id TEXT NOT NULL,
    PRIMARY KEY (user_id, position)
);

CREATE TABLE reservations (
    reservation_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    user_id TEXT NOT NULL,
    origin TEXT NOT NULL,
    destination TEXT NOT NULL,
    flight_type TEXT NOT NULL CHECK (flight_type IN ('round_trip', 'one_way')),
    cabin TEXT NOT NULL,
    created_at TEXT NOT NULL,
    -- No declared type on purpose: τ²'s update_reservation_baggages stores the counts as given
    -- (an int, a float or a string), and a declared affinity would change what it dumps.
    total_baggages CHECK (typeof(total_baggages) IN ('null', 'integer', 'real', 'text')),
    nonfree_baggages CHECK (typeof(nonfree_baggages) IN ('null', 'integer', 'real', 'text')),
    insurance TEXT NOT NULL CHECK (insurance IN ('yes', 'no')),
    status TEXT CHECK (status IS NULL OR status = 'cancelled')
);

CREATE TABLE reservation_flights (
    reservation_id TEXT NOT NULL REFERENCES reservations (reservation_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    flight_number TEXT NOT NULL,
    origin TEXT NOT NULL,
    destination TEXT NOT NULL,
    date TEXT NOT NULL,
    price INTEGER NOT NULL,
    PRIMARY KEY (reservation_id, position)
);

CREATE TABLE reservation_passengers (
    reservation_id TEXT NOT NULL REFERENCES reservations (reservation_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    dob TEXT NOT NULL,
    PRIMARY KEY (reservation_id, position)
);

-- A reservation's payment history: payments positive, refunds negative, in order.
CREATE TABLE reservation_payments (
    reservation_id TEXT NOT NULL REFERENCES reservations (reservation_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    payment_id TEXT NOT NULL,
    amount INTEGER NOT NULL,
    PRIMARY KEY (reservation_id, position)
);
