/** How console routes read their input: the body's fields (CSRF checked), zod schemas, page sizes. */
import type { FastifyRequest } from 'fastify';
import { z } from 'zod';
import { parsed } from '../requests.ts';
import { requireCsrf } from './auth.ts';

export type Guard = (req: FastifyRequest) => Promise<void>;

/** A form's (or a JSON body's) fields: strings, or lists of them for a repeated field. */
export type Fields = Record<string, string | string[] | undefined>;

/** R2: the body's fields, the CSRF token checked. */
export function fieldsOf(req: FastifyRequest): Fields {
  const body = req.body;
  const fields: Fields = body && typeof body === 'object' && !Array.isArray(body) ? (body as Fields) : {};
  requireCsrf(req, fields._csrf);
  return fields;
}

/** `schema` applied to a request part; `invalid_argument` otherwise. */
export const check = <T>(schema: z.ZodType<T>, input: unknown, what: string): T => parsed(schema, input, 'invalid_argument', what);

/** R3 */
export const MAX_PAGE = 200;
export const DEFAULT_PAGE = 50;

export const PageSize = z.coerce.number().int().min(1).max(MAX_PAGE).default(DEFAULT_PAGE);
