-- SkyForge Airlines: loyalty members, airports, flights with per-cabin inventory, reservations,
-- passengers (with checked bags), stored cards, and the payment ledger (charges, refunds, credit).
-- Money is REAL with two decimals; dates are ISO strings ('YYYY-MM-DD'); card expiry is 'YYYY-MM'.

CREATE TABLE members (
    member_id      TEXT PRIMARY KEY CHECK (member_id LIKE 'M-%'),
    first_name     TEXT NOT NULL,
    last_name      TEXT NOT NULL,
    email          TEXT NOT NULL UNIQUE,
    phone          TEXT NOT NULL,
    date_of_birth  TEXT NOT NULL,
    tier           TEXT NOT NULL CHECK (tier IN ('basic', 'silver', 'gold', 'platinum')),
    travel_credit  REAL NOT NULL DEFAULT 0 CHECK (travel_credit >= 0),
    status         TEXT NOT NULL CHECK (status IN ('active', 'suspended'))
);

CREATE TABLE payment_methods (
    payment_method_id  TEXT PRIMARY KEY CHECK (payment_method_id LIKE 'PM-%'),
    member_id          TEXT NOT NULL REFERENCES members (member_id),
    brand              TEXT NOT NULL CHECK (brand IN ('visa', 'mastercard', 'amex')),
    last4              TEXT NOT NULL CHECK (length(last4) = 4),
    expiry             TEXT NOT NULL CHECK (expiry GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]')
);

CREATE TABLE airports (
    airport_code  TEXT PRIMARY KEY CHECK (length(airport_code) = 3),
    name          TEXT NOT NULL,
    city          TEXT NOT NULL,
    country       TEXT NOT NULL
);

CREATE TABLE flights (
    flight_id       TEXT PRIMARY KEY CHECK (flight_id LIKE 'FL-%'),
    flight_number   TEXT NOT NULL,
    origin          TEXT NOT NULL REFERENCES airports (airport_code),
    destination     TEXT NOT NULL REFERENCES airports (airport_code),
    departure_date  TEXT NOT NULL,
    departure_time  TEXT NOT NULL,
    arrival_time    TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('scheduled', 'delayed', 'departed', 'landed', 'cancelled')),
    delay_minutes   INTEGER NOT NULL DEFAULT 0 CHECK (delay_minutes >= 0),
    CHECK (origin <> destination),
    UNIQUE (flight_number, departure_date)
);

CREATE TABLE flight_cabins (
    flight_id   TEXT NOT NULL REFERENCES flights (flight_id),
    cabin       TEXT NOT NULL CHECK (cabin IN ('economy', 'premium_economy', 'business')),
    capacity    INTEGER NOT NULL CHECK (capacity > 0),
    seats_sold  INTEGER NOT NULL CHECK (seats_sold >= 0 AND seats_sold <= capacity),
    fare        REAL NOT NULL CHECK (fare > 0),
    PRIMARY KEY (flight_id, cabin)
);

CREATE TABLE reservations (
    reservation_id      TEXT PRIMARY KEY CHECK (reservation_id LIKE 'R-%'),
    member_id           TEXT NOT NULL REFERENCES members (member_id),
    flight_id           TEXT NOT NULL,
    cabin               TEXT NOT NULL CHECK (cabin IN ('economy', 'premium_economy', 'business')),
    fare_per_passenger  REAL NOT NULL CHECK (fare_per_passenger >= 0),
    status              TEXT NOT NULL CHECK (status IN ('confirmed', 'checked_in', 'flown', 'cancelled')),
    booked_on           TEXT NOT NULL,
    FOREIGN KEY (flight_id, cabin) REFERENCES flight_cabins (flight_id, cabin)
);

CREATE TABLE passengers (
    passenger_id   TEXT PRIMARY KEY CHECK (passenger_id LIKE 'P-%'),
    reservation_id TEXT NOT NULL REFERENCES reservations (reservation_id),
    first_name     TEXT NOT NULL,
    last_name      TEXT NOT NULL,
    date_of_birth  TEXT NOT NULL,
    checked_bags   INTEGER NOT NULL DEFAULT 0 CHECK (checked_bags BETWEEN 0 AND 3),
    checked_in     INTEGER NOT NULL DEFAULT 0 CHECK (checked_in IN (0, 1))
);

CREATE TABLE payments (
    payment_id         TEXT PRIMARY KEY CHECK (payment_id LIKE 'PAY-%'),
    reservation_id     TEXT NOT NULL REFERENCES reservations (reservation_id),
    kind               TEXT NOT NULL CHECK (kind IN ('charge', 'refund', 'compensation')),
    source             TEXT NOT NULL CHECK (source IN ('card', 'travel_credit')),
    payment_method_id  TEXT REFERENCES payment_methods (payment_method_id),
    amount             REAL NOT NULL CHECK (amount > 0),
    description        TEXT NOT NULL,
    CHECK ((source = 'card') = (payment_method_id IS NOT NULL)),
    CHECK (kind <> 'compensation' OR source = 'travel_credit')
);

-- Lookups by owner: a member's cards and reservations, a reservation's passengers and payments,
-- the flights on a route and date. The tables are small, but tools make these lookups on every
-- call, and without an index each one reads the whole table.
CREATE INDEX payment_methods_by_member ON payment_methods (member_id);
CREATE INDEX reservations_by_member ON reservations (member_id);
CREATE INDEX passengers_by_reservation ON passengers (reservation_id);
CREATE INDEX payments_by_reservation ON payments (reservation_id);
CREATE INDEX flights_by_route ON flights (origin, destination, departure_date);
