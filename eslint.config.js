// Lint: type-aware rules that catch what the type checker does not (a promise nobody awaits,
// an import that is only a type). `npm run lint`; part of `.ci/run`.
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'drizzle/', 'coverage/', 'dist/', '.corral/'] },
  {
    files: ['**/*.ts'],
    languageOptions: {
      parser: tseslint.parser,
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    plugins: { '@typescript-eslint': tseslint.plugin },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': ['error', { checksVoidReturn: false }],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  {
    // Drizzle is loaded once, as CommonJS, by src/db/orm.ts (its ES-module build costs a command
    // ~400 ms of start-up, and two builds in one process would not share classes).
    files: ['**/*.ts'],
    ignores: ['src/db/orm.ts'],
    rules: {
      '@typescript-eslint/no-restricted-imports': [
        'error',
        { patterns: [{ group: ['drizzle-orm', 'drizzle-orm/*'], message: 'import Drizzle from src/db/orm.ts' }] },
      ],
      'no-restricted-syntax': [
        'error',
        { selector: 'ImportExpression[source.value=/^drizzle-orm(\\/|$)/]', message: 'import Drizzle from src/db/orm.ts' },
      ],
    },
  },
);
