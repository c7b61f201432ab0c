-- Car rental desk. Ids are TEXT with a readable prefix; money is integer cents.
CREATE TABLE locations (
    location_id TEXT PRIMARY KEY CHECK (location_id LIKE 'LOC-%'),
    city        TEXT NOT NULL UNIQUE
);

CREATE TABLE customers (
    customer_id   TEXT PRIMARY KEY CHECK (customer_id LIKE 'C-%'),
    name          TEXT NOT NULL,
    licence_valid INTEGER NOT NULL CHECK (licence_valid IN (0, 1))
);

CREATE TABLE cars (
    car_id           TEXT PRIMARY KEY CHECK (car_id LIKE 'V-%'),
    model            TEXT NOT NULL,
    category         TEXT NOT NULL CHECK (category IN ('economy', 'compact', 'suv', 'van')),
    daily_rate_cents INTEGER NOT NULL CHECK (daily_rate_cents > 0),
    status           TEXT NOT NULL CHECK (status IN ('available', 'rented', 'maintenance')),
    location_id      TEXT NOT NULL REFERENCES locations (location_id)
);

CREATE TABLE rentals (
    rental_id   TEXT PRIMARY KEY CHECK (rental_id LIKE 'R-%'),
    car_id      TEXT NOT NULL REFERENCES cars (car_id),
    customer_id TEXT NOT NULL REFERENCES customers (customer_id),
    start_date  TEXT NOT NULL,
    days        INTEGER NOT NULL CHECK (days BETWEEN 1 AND 30),
    total_cents INTEGER NOT NULL CHECK (total_cents > 0),
    status      TEXT NOT NULL CHECK (status IN ('open', 'closed'))
);
