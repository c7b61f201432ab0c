-- τ²-bench's retail DB (products, users, orders: nested JSON) as relational tables.
--
-- Every `position` column exists to give back τ²'s exact order: dict-valued fields (a product's
-- variants, a user's payment methods) keep db.json's insertion order and lists (a user's orders,
-- an order's items, fulfillments and payments) keep theirs, because the agent sees them in that
-- order. Small nested values that no tool queries (option dicts, id lists) are JSON text, written
-- with json.dumps' default separators and key order kept.

CREATE TABLE products (
    product_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0)
);

-- A product's variants ("items"): item ids are unique across all products.
CREATE TABLE variants (
    item_id TEXT PRIMARY KEY,
    product_id TEXT NOT NULL REFERENCES products (product_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    options TEXT NOT NULL CHECK (json_valid(options) AND json_type(options) = 'object'),
    available INTEGER NOT NULL CHECK (available IN (0, 1)),
    price REAL NOT NULL CHECK (price >= 0),
    UNIQUE (product_id, position)
);

CREATE TABLE users (
    user_id TEXT PRIMARY KEY,
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    email TEXT NOT NULL,
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0)
);

-- A user's default address (one per user).
CREATE TABLE user_addresses (
    user_id TEXT PRIMARY KEY REFERENCES users (user_id),
    address1 TEXT NOT NULL,
    address2 TEXT NOT NULL,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    state TEXT NOT NULL,
    zip TEXT NOT NULL
);

-- τ²'s three payment-method models in one table: which columns are set follows `source`.
CREATE TABLE payment_methods (
    payment_method_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (user_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    source TEXT NOT NULL CHECK (source IN ('credit_card', 'gift_card', 'paypal')),
    brand TEXT,
    last_four TEXT,
    balance REAL CHECK (balance IS NULL OR balance >= 0),
    UNIQUE (user_id, position),
    CHECK ((source = 'credit_card') = (brand IS NOT NULL AND last_four IS NOT NULL)),
    CHECK (source = 'credit_card' OR (brand IS NULL AND last_four IS NULL)),
    CHECK ((source = 'gift_card') = (balance IS NOT NULL))
);

CREATE TABLE orders (
    order_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL REFERENCES users (user_id),
    position INTEGER NOT NULL UNIQUE CHECK (position >= 0),
    -- index of this order in its user's `orders` list (NULL: the user's list leaves it out)
    user_position INTEGER CHECK (user_position IS NULL OR user_position >= 0),
    address1 TEXT NOT NULL,
    address2 TEXT NOT NULL,
    city TEXT NOT NULL,
    country TEXT NOT NULL,
    state TEXT NOT NULL,
    zip TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN (
        'processed', 'pending', 'pending (item modified)', 'delivered', 'cancelled',
        'exchange requested', 'return requested'
    )),
    cancel_reason TEXT CHECK (cancel_reason IN ('no longer needed', 'ordered by mistake')),
    exchange_items TEXT CHECK (exchange_items IS NULL OR json_type(exchange_items) = 'array'),
    exchange_new_items TEXT CHECK (exchange_new_items IS NULL OR json_type(exchange_new_items) = 'array'),
    exchange_payment_method_id TEXT REFERENCES payment_methods (payment_method_id),
    -- No declared type on purpose: τ² stores round(diff, 2) unvalidated, which is the int 0 for an
    -- empty exchange and may be -0.0; REAL affinity would turn both into 0.0 and change the hash.
    exchange_price_difference CHECK (typeof(exchange_price_difference) IN ('null', 'integer', 'real')),
    return_items TEXT CHECK (return_items IS NULL OR json_type(return_items) = 'array'),
    return_payment_method_id TEXT REFERENCES payment_methods (payment_method_id),
    UNIQUE (user_id, user_position),
    CHECK (cancel_reason IS NULL OR status = 'cancelled'),
    CHECK (exchange_items IS NULL OR status = 'exchange requested'),
    CHECK (return_items IS NULL OR status = 'return requested')
);

CREATE TABLE order_items (
    order_id TEXT NOT NULL REFERENCES orders (order_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    name TEXT NOT NULL,
    product_id TEXT NOT NULL REFERENCES products (product_id),
    item_id TEXT NOT NULL REFERENCES variants (item_id),
    price REAL NOT NULL CHECK (price >= 0),
    options TEXT NOT NULL CHECK (json_valid(options) AND json_type(options) = 'object'),
    PRIMARY KEY (order_id, position)
);

CREATE TABLE order_fulfillments (
    order_id TEXT NOT NULL REFERENCES orders (order_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    tracking_id TEXT NOT NULL CHECK (json_type(tracking_id) = 'array'),
    item_ids TEXT NOT NULL CHECK (json_type(item_ids) = 'array'),
    PRIMARY KEY (order_id, position)
);

-- An order's payment history: payments and refunds, in the order they happened.
CREATE TABLE order_payments (
    order_id TEXT NOT NULL REFERENCES orders (order_id),
    position INTEGER NOT NULL CHECK (position >= 0),
    transaction_type TEXT NOT NULL CHECK (transaction_type IN ('payment', 'refund')),
    amount REAL NOT NULL CHECK (amount >= 0),
    payment_method_id TEXT NOT NULL REFERENCES payment_methods (payment_method_id),
    PRIMARY KEY (order_id, position)
);
